(function(){
const D=JSON.parse(document.getElementById('report-data').textContent);
const NS='http://www.w3.org/2000/svg';
const COLORS=['#0969da','#1a7f37','#8250df','#bf3989','#bc4c00','#0550ae','#116329','#6639ba','#953800','#4d2d00'];
function el(n,a,p){const e=document.createElementNS(NS,n);for(const k in a)e.setAttribute(k,a[k]);if(p)p.appendChild(e);return e;}
function txt(p,x,y,s,a){const t=el('text',Object.assign({x:x,y:y,'font-size':11,fill:'#57606a'},a||{}),p);t.textContent=s;return t;}
// Bytes as vramhook_model::fmt_bytes writes them (the text report's numbers): whole bytes, else two decimals up to TiB.
function fb(b){const u=['B','KiB','MiB','GiB','TiB'];let i=0;while(b>=1024&&i<4){b/=1024;i++;}return (i?b.toFixed(2):b.toFixed(0))+' '+u[i];}
function fs(ns){return (ns/1e9).toFixed(ns<1e7?6:3)+'s';}
const T0=D.t0,T1=Math.max(D.t1,D.t0+1);
// OOM markers: failures closer than MERGE_PX on the plot share one line (its label counts
// them); labels that would overlap go one row lower, and past LABEL_ROWS rows the label is
// left to the line's tooltip.
const MERGE_PX=6,LABEL_ROWS=4,LABEL_GAP=6;
function markers(svg,list,x,top,bottom,right){
  const ms=list.map(o=>({px:x(o[0]),o:o})).sort((a,b)=>a.px-b.px);const groups=[];
  for(const m of ms){const g=groups[groups.length-1];if(g&&m.px-g.px<MERGE_PX)g.items.push(m.o);else groups.push({px:m.px,items:[m.o]});}
  const rows=[];
  for(const g of groups){
    const pids=[...new Set(g.items.map(o=>o[1]))];const n=g.items.length;
    const label=n==1?'OOM pid '+pids[0]:n+' OOMs, pid'+(pids.length>1?'s ':' ')+pids.slice(0,3).join(', ')+(pids.length>3?', …':'');
    const line=el('line',{x1:g.px,x2:g.px,y1:top,y2:bottom,stroke:'#d1242f','stroke-width':2,'stroke-dasharray':'5,3',class:'oom-marker','data-count':n},svg);
    el('title',{},line).textContent=g.items.map(o=>'OOM pid '+o[1]+' at +'+fs(o[0]-T0)+' ('+o[3]+')').join('\n');
    const t=txt(svg,0,0,label,{fill:'#d1242f',class:'oom-label'});
    const w=t.getComputedTextLength()||label.length*6.5;
    const flip=g.px+4+w>right;const x0=flip?g.px-4-w:g.px+4;
    let r=rows.findIndex(end=>end+LABEL_GAP<=x0);
    if(r<0&&rows.length<LABEL_ROWS){rows.push(-Infinity);r=rows.length-1;}
    if(r<0){t.remove();continue;}
    rows[r]=x0+w;t.setAttribute('x',x0);t.setAttribute('y',top+12+13*r);}
}
function plot(id,title,series,fmt,opt){
  opt=opt||{};const host=document.getElementById(id);const rows=Math.ceil(series.filter(s=>s.pts.length).length/4);const W=1300,B=34+18*rows,H=(opt.h||240)+18*rows,L=80,R=20,TP=28;
  const svg=el('svg',{width:W,height:H,viewBox:'0 0 '+W+' '+H,class:'plot','data-plot':id},host);
  txt(svg,L,18,title,{'font-size':13,fill:'#1d2329','font-weight':600});
  let ymax=opt.ymax||0;for(const s of series)for(const p of s.pts)ymax=Math.max(ymax,p[2]);
  if(!(ymax>0))ymax=1;
  const x=t=>L+(W-L-R)*(t-T0)/(T1-T0),y=v=>H-B-(H-B-TP)*v/ymax;
  el('rect',{x:L,y:TP,width:W-L-R,height:H-B-TP,fill:'#fbfcfd',stroke:'#d0d7de'},svg);
  const empty=series.every(s=>!s.pts.length);
  if(empty){svg.setAttribute('data-empty','yes');txt(svg,W/2,H/2,'no data for this plot in the '+(D.captured?'capture':'input'),{'text-anchor':'middle','font-size':13,class:'no-data'});}
  else{
    // Ticks whose label would repeat the one below (a tiny range: 0 B, 0 B, 1 B) are left out.
    let prev=null;for(let i=0;i<=4;i++){const v=ymax*i/4,lab=fmt(v);if(lab===prev)continue;prev=lab;el('line',{x1:L,x2:W-R,y1:y(v),y2:y(v),stroke:'#eaeef2'},svg);txt(svg,L-6,y(v)+4,lab,{'text-anchor':'end',class:'tick'});}
    for(let i=0;i<=6;i++){const t=T0+(T1-T0)*i/6;txt(svg,x(t),H-B+16,'+'+fs(t-T0),{'text-anchor':i==0?'start':i==6?'end':'middle'});}}
  markers(svg,opt.markers||[],x,TP,H-B,W-R);
  if(empty)return svg;
  series.forEach((s,i)=>{const c=s.color||COLORS[i%COLORS.length];if(!s.pts.length)return;
    let d='';s.pts.forEach((p,j)=>{const X=x(p[0]).toFixed(1);d+=(j?'H'+X+'V':'M'+X+' ')+y(p[3]).toFixed(1);
      if(p[1]!==p[2])el('line',{x1:X,x2:X,y1:y(p[1]),y2:y(p[2]),stroke:c,'stroke-opacity':0.35},svg);});
    const last=s.pts[s.pts.length-1];d+='H'+x(Math.max(last[0],opt.extend?T1:last[0])).toFixed(1);
    el('path',{d:d,fill:'none',stroke:c,'stroke-width':2,'stroke-dasharray':s.dash||'',class:'series'},svg);
    // Sparse readings (measured now and then) are dots too: one reading is no line at all.
    if(s.dots&&s.pts.length<=200||s.pts.length==1)s.pts.forEach(p=>el('circle',{cx:x(p[0]).toFixed(1),cy:y(p[3]).toFixed(1),r:3.5,fill:c,class:'reading'},svg));
    const k=series.filter(q=>q.pts.length).indexOf(s),lx=L+(k%4)*300,ly=H-B+36+Math.floor(k/4)*18;el('rect',{x:lx,y:ly-9,width:10,height:10,fill:c,class:'legend-key'},svg);
    // Four to a row, 300 px each: a longer name is cut with an ellipsis (whole in its tooltip),
    // so that no label runs into the next one.
    const lt=txt(svg,lx+14,ly,s.name,{fill:'#1d2329',class:'legend'});let n=s.name;
    while(n.length>1&&lt.getComputedTextLength&&lt.getComputedTextLength()>280){n=n.slice(0,-1);lt.textContent=n+'\u2026';}
    el('title',{},lt).textContent=s.name;});
  if(opt.draw)opt.draw(svg,x,y);
  return svg;}
const marks=D.ooms;
const live=[];D.timelines.processes.forEach(p=>live.push({name:'pid '+p.pid+' '+p.command.split(' ')[0].split('/').pop(),pts:p.live_bytes}));
D.timelines.devices.forEach(d=>live.push({name:'device '+d.device+' (all traced)',pts:d.live_bytes,dash:'6,3',color:'#57606a'}));
plot('plot-live','Live bytes per process and per device',live,fb,{markers:marks});
// Framework caches (lens or snapshot): reserved solid, allocated dashed, largest free block
// dotted, one colour per cache; fragmentation on its own 0..1 plot. Drawn only where the
// page has their places (the report has framework timelines).
if(document.getElementById('plot-fw-bytes')){
  const fw=D.timelines.frameworks.slice(0,10);
  function cache(f){return 'pid '+f.pid+' GPU '+f.device+' '+f.framework+(f.source==='snapshot'?' (snapshot)':'');}
  const bytes=[];fw.forEach((f,i)=>{const c=COLORS[i%COLORS.length];
    bytes.push({name:cache(f)+' reserved',pts:f.reserved_bytes,color:c});
    bytes.push({name:cache(f)+' allocated',pts:f.allocated_bytes,color:c,dash:'6,3'});
    bytes.push({name:cache(f)+' largest free block',pts:f.largest_free_block,color:c,dash:'2,2',dots:true});});
  plot('plot-fw-bytes','Framework cache: reserved, allocated, largest free block',bytes,fb,{markers:marks});
  plot('plot-fw-frag','Framework cache fragmentation (1 − largest free block / reserved but unallocated)',fw.map((f,i)=>({name:cache(f),pts:f.fragmentation,color:COLORS[i%COLORS.length],dots:true})),v=>v.toFixed(2),{markers:marks,ymax:1});}
const free=[];let tot=0;D.timelines.devices.forEach(d=>{free.push({name:'device '+d.device+' free (driver)',pts:d.free_bytes});tot=Math.max(tot,d.total_bytes||0);});
plot('plot-free','Device free bytes (driver samples)'+(tot?' — total '+fb(tot):''),free,fb,{markers:marks,ymax:tot,extend:true});
// The fit of the next large request, one plot per process and device the page has a place
// for: the ratio (clipped so that 1 stays in view), a dashed line at 1, a triangle where it
// went below 1 (down, red) and back (up, green), and this process's OOMs on this device.
const FIT_CAP=4;
D.timelines.fits.forEach((f,k)=>{const id='plot-fit-'+k;if(!document.getElementById(id))return;
  let top=0;f.fit_ratio.forEach(p=>{top=Math.max(top,p[2]);});
  const cap=Math.min(Math.max(top*1.05,1.25),FIT_CAP),clip=v=>Math.min(v,cap);
  const who='pid '+f.pid+' '+f.command.split(' ')[0].split('/').pop()+' GPU '+f.device;
  const line=[[T0,1,1,1],[T1,1,1,1]];
  plot(id,'Fit of the next large request: '+who+' (supply / demand'+(top>cap?', clipped at '+cap.toFixed(2):'')+')',
    [{name:who+' fit',pts:f.fit_ratio.map(p=>[p[0],clip(p[1]),clip(p[2]),clip(p[3])])},
     {name:'fit = 1: below it, that request fails',pts:line,color:'#d1242f',dash:'4,4'}],
    v=>v.toFixed(2),{h:180,ymax:cap,markers:marks.filter(o=>o[1]===f.pid&&o[2]===f.device),
    draw:(svg,x,y)=>{D.fit_warnings.filter(w=>w.pid===f.pid&&w.device===f.device).forEach(w=>{
      const x0=x(Math.max(w.since_ts_ns,T0)),x1=x(Math.min(w.came_ts_ns===null?T1:w.came_ts_ns,T1));
      el('title',{},el('rect',{x:x0,y:y(cap),width:Math.max(x1-x0,1),height:y(0)-y(cap),fill:'#d1242f','fill-opacity':0.08,class:'fit-warning-span'},svg)).textContent='from +'+fs(w.since_ts_ns-T0)+' on, a '+fb(w.demand_bytes)+' request would not have fit';});
      f.crossings.forEach(c=>{const X=x(c.ts_ns),Y=y(1),d=c.below?6:-6;
      const m=el('path',{d:'M'+(X-5)+' '+(Y-d)+'L'+(X+5)+' '+(Y-d)+'L'+X+' '+Y+'Z',fill:c.below?'#d1242f':'#1a7f37',class:'fit-crossing','data-below':c.below?'yes':'no'},svg);
      el('title',{},m).textContent=(c.below?'below 1':'back to 1 or more')+' at +'+fs(c.ts_ns-T0)+': fit '+c.fit_ratio.toFixed(2)+', demand '+fb(c.demand_bytes)+', supply '+fb(c.supply_bytes);});}});});
const fr=D.fragmentation.slice(0,10);
// An arena by kind, base, process and device ("device ?" only where no handle named one).
const KIND={VmmReservation:'VMM reservation',Pool:'pool',FrameworkSegment:'framework segment'};
function arena(a){return (KIND[a.kind]||a.kind)+' 0x'+a.base.toString(16)+' pid '+a.pid+' '+(a.device>=0?'GPU '+a.device:'device ?');}
plot('plot-frag','Fragmentation per arena (1 − largest free span / free in arena)',fr.map(a=>({name:arena(a),pts:a.fragmentation})),v=>v.toFixed(2),{markers:marks,ymax:1});
plot('plot-span','Largest free span per arena',fr.map(a=>({name:arena(a),pts:a.largest_free_span})),fb,{markers:marks});
(function(){const host=document.getElementById('plot-layout');const L=D.layout;const W=1300;
  const ents=L?L.entries:[];const ar=L?L.arenas:[];
  const rows=[];const bydev={};ents.forEach(e=>{(bydev[e.device]=bydev[e.device]||[]).push(e);});
  const devs=Object.keys(bydev);const H=60+devs.length*70+ar.length*26+(ents.length?0:30);
  const svg=el('svg',{width:W,height:H,viewBox:'0 0 '+W+' '+H,class:'plot','data-plot':'plot-layout'},host);
  txt(svg,20,18,L?('Address layout at +'+fs(L.ts_ns-T0)+' ('+L.reason+'): '+ents.length+' live allocations'):'Address layout: no moment captured',{'font-size':13,fill:'#1d2329','font-weight':600});
  txt(svg,20,34,'Width ∝ size. Hatched gaps between plain allocations are virtual address gaps, NOT free VRAM; only gaps inside arenas are free space.');
  const defs=el('defs',{},svg);const pat=el('pattern',{id:'hatch',width:6,height:6,patternUnits:'userSpaceOnUse',patternTransform:'rotate(45)'},defs);el('line',{x1:0,y1:0,x2:0,y2:6,stroke:'#8c959f','stroke-width':2},pat);
  const CC={plain:'#0969da',pitch:'#1a7f37',managed:'#8250df',pool:'#bf3989',vmm:'#bc4c00',array:'#57606a',ipc:'#6e7781',import:'#6e7781'};
  let yy=50;if(!ents.length&&L)txt(svg,20,yy+14,'no live allocations at this moment');
  devs.forEach(dv=>{const es=bydev[dv];es.sort((a,b)=>a.addr-b.addr);let gaps=0;for(let i=1;i<es.length;i++)if(es[i].addr>es[i-1].addr+es[i-1].size)gaps++;
    const total=es.reduce((s,e)=>s+e.size,0)||1;const GW=6,avail=W-40-gaps*GW;let X=20;
    txt(svg,20,yy+10,'device '+dv+': '+fb(total)+' live in '+es.length+' allocations');
    es.forEach((e,i)=>{if(i&&e.addr>es[i-1].addr+es[i-1].size){el('rect',{x:X,y:yy+16,width:GW,height:36,fill:'url(#hatch)'},svg);X+=GW;}
      const w=Math.max(0.5,avail*e.size/total);const r=el('rect',{x:X,y:yy+16,width:w,height:36,fill:CC[e.class]||'#0969da',stroke:'#fff','stroke-width':0.5,class:'alloc'},svg);
      const t=el('title',{},r);t.textContent='0x'+e.addr.toString(16)+' '+fb(e.size)+' '+e.class+' pid '+e.pid;X+=w;});
    yy+=70;});
  if(ar.length){txt(svg,20,yy+4,'Arenas (occupied in colour, free in grey; the largest free span outlined):');yy+=12;
    ar.forEach(a=>{const w=W-620;el('rect',{x:20,y:yy,width:w,height:18,fill:'#eaeef2'},svg);
      el('rect',{x:20,y:yy,width:w*(a.size?a.occupied/a.size:0),height:18,fill:'#bc4c00',class:'arena-occupied'},svg);
      if(a.size)el('rect',{x:20+w-w*a.largest_free_span/a.size,y:yy,width:w*a.largest_free_span/a.size,height:18,fill:'none',stroke:'#1a7f37','stroke-width':2},svg);
      txt(svg,w+30,yy+13,arena(a)+': '+fb(a.occupied)+' / '+fb(a.size)+', largest free '+fb(a.largest_free_span)+', frag '+a.fragmentation.toFixed(2));yy+=26;});}
})();
document.body.setAttribute('data-rendered','yes');
})();
