// The vramhook Grafana dashboard, built with Grafana's Apache-licensed
// grafana-foundation-sdk (dashboard as code):
//
//	dashboard gen   > deploy/grafana/vramhook.json   writes the dashboard JSON
//	dashboard check deploy/grafana/vramhook.json     decodes it strictly, validates it,
//	                                                 checks that it is what gen writes,
//	                                                 and prints every PromQL query, one a line
//	                                                 (the host variable's as PromQL too)
//
// The tests run every printed query against a real Prometheus fed by two real agents
// (Grafana's $instance and $__rate_interval replaced) and fail on one that returns nothing.
// Label names are those of Prometheus's OTLP translation, which the agent's /metrics uses
// too: process_pid, process_executable_name, device, kind, verdict; instance is the host.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// A filter on the host variable, for every query.
const host = `instance=~"$instance"`

// The host variable: Grafana's label_values, and the same as PromQL for the check.
const (
	hostVariable = "label_values(vramhook_device_memory_total_bytes, instance)"
	hostPromQL   = "group by (instance) (vramhook_device_memory_total_bytes)"
)

type panel struct {
	title, unit, description string
	queries                  [][2]string // expr, legend
	links                    []cog.Builder[dashboard.DashboardLink]
}

var panels = []panel{
	{title: "Device memory", unit: "bytes",
		description: "Per GPU: total and free as the driver reports them, held by traced processes, and the rest (untraced processes, driver contexts).",
		queries: [][2]string{
			{`vramhook_device_memory_total_bytes{` + host + `}`, "{{instance}} gpu {{device}} total"},
			{`vramhook_device_memory_free_bytes{` + host + `}`, "{{instance}} gpu {{device}} free"},
			{`vramhook_device_memory_traced_bytes{` + host + `}`, "{{instance}} gpu {{device}} traced"},
			{`vramhook_device_memory_untraced_bytes{` + host + `}`, "{{instance}} gpu {{device}} untraced"},
		}},
	{title: "GPU memory used (OpenTelemetry hardware conventions)", unit: "percentunit",
		description: "hw.gpu.memory.usage / hw.gpu.memory.limit: the semantic-convention names other GPU tools use too.",
		queries: [][2]string{
			{`hw_gpu_memory_usage_bytes{` + host + `} / hw_gpu_memory_limit_bytes{` + host + `}`, "{{instance}} {{hw_name}}"},
		}},
	{title: "Live bytes by process", unit: "bytes",
		description: "Device memory each traced process holds, per GPU.",
		queries: [][2]string{
			{`sum by (instance, device, process_pid, process_executable_name) (vramhook_process_memory_live_bytes{` + host + `})`, "{{instance}} {{process_executable_name}} ({{process_pid}}) gpu {{device}}"},
		}},
	{title: "Live bytes by kind", unit: "bytes",
		description: "Plain allocations, stream-ordered pools, VMM, managed, pitched...",
		queries: [][2]string{
			{`sum by (instance, kind) (vramhook_process_memory_live_by_kind_bytes{` + host + `})`, "{{instance}} {{kind}}"},
		}},
	{title: "Largest free span", unit: "bytes",
		description: "The largest request each process's arenas (VMM reservations, pools) could still serve without new memory.",
		queries: [][2]string{
			{`vramhook_process_memory_largest_free_span_bytes{` + host + `}`, "{{instance}} {{process_executable_name}} ({{process_pid}})"},
		}},
	{title: "Fragmentation", unit: "percentunit",
		description: "1 - largest free span / free bytes in the arenas.",
		queries: [][2]string{
			{`vramhook_process_memory_fragmentation_ratio{` + host + `}`, "{{instance}} {{process_executable_name}} ({{process_pid}})"},
		}},
	{title: "Framework cache", unit: "bytes",
		description: "What a framework's lens says of its own cache (the PyTorch lens): reserved from the driver, handed out to the program, and the largest block it could hand out whole. Reserved minus allocated is free inside the cache, invisible to the driver.",
		queries: [][2]string{
			{`vramhook_process_framework_reserved_bytes{` + host + `}`, "{{instance}} {{process_executable_name}} ({{process_pid}}) {{framework}} reserved"},
			{`vramhook_process_framework_allocated_bytes{` + host + `}`, "{{instance}} {{process_executable_name}} ({{process_pid}}) {{framework}} allocated"},
			{`vramhook_process_framework_largest_free_block_bytes{` + host + `}`, "{{instance}} {{process_executable_name}} ({{process_pid}}) {{framework}} largest free block"},
		}},
	{title: "Framework cache fragmentation", unit: "percentunit",
		description: "1 - largest free block / free bytes inside the framework's cache: near 1, the cache's free memory is in pieces too small for large requests (PyTorch: try expandable_segments:True).",
		queries: [][2]string{
			{`vramhook_process_framework_fragmentation_ratio{` + host + `}`, "{{instance}} {{process_executable_name}} ({{process_pid}}) {{framework}}"},
		}},
	{title: "Fit of the next large request", unit: "none",
		description: "Per process and device: what it could get now for a request as large as its largest recent one (made and given back), over that request. Below 1 that request would fail now (alert VramhookNextLargeRequestWouldFail); a ratio falling toward 1 is the earlier sign.",
		queries: [][2]string{
			{`vramhook_process_memory_fit_ratio{` + host + `}`, "{{instance}} {{process_executable_name}} ({{process_pid}}) GPU {{device}}"},
		}},
	{title: "OOM incidents by verdict", unit: "short",
		description: "Out-of-memory incidents per GPU by vramhook's verdict; they outlive the process that failed. Each incident is also a span vramhook.oom in Jaeger (link).",
		queries: [][2]string{
			{`sum by (instance, device, verdict) (increase(vramhook_device_ooms_total{` + host + `}[$__rate_interval]))`, "{{instance}} gpu {{device}} {{verdict}}"},
		},
		links: []cog.Builder[dashboard.DashboardLink]{
			dashboard.NewDashboardLinkBuilder("OOM incidents in Jaeger").
				Type(dashboard.DashboardLinkTypeLink).
				Url("${jaeger}/search?service=vramhook-agent&operation=vramhook.oom").
				TargetBlank(true),
		}},
	{title: "Dropped events", unit: "short",
		description: "Events lost before the model, by where (ring full, restart, ...): numbers are incomplete where this is not zero.",
		queries: [][2]string{
			{`sum by (instance, kind) (increase(vramhook_agent_events_dropped_total{` + host + `}[$__rate_interval]))`, "{{instance}} {{kind}}"},
		}},
}

func build() ([]byte, error) {
	b := dashboard.NewDashboardBuilder("vramhook: GPU memory").
		Uid("vramhook").
		Tags([]string{"vramhook", "gpu"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		WithVariable(dashboard.NewQueryVariableBuilder("instance").
			Label("Host").
			Query(dashboard.StringOrMap{String: cog.ToPtr(hostVariable)}).
			Multi(true).
			IncludeAll(true).
			AllValue(".*")).
		WithVariable(dashboard.NewConstantVariableBuilder("jaeger").Value(dashboard.StringOrMap{String: cog.ToPtr("http://jaeger:16686")}))
	for _, p := range panels {
		pb := timeseries.NewPanelBuilder().Title(p.title).Description(p.description).Unit(p.unit).Span(12).Height(8)
		for _, q := range p.queries {
			pb = pb.WithTarget(prometheus.NewDataqueryBuilder().Expr(q[0]).LegendFormat(q[1]))
		}
		if len(p.links) > 0 {
			pb = pb.Links(p.links)
		}
		b = b.WithPanel(pb)
	}
	d, err := b.Build()
	if err != nil {
		return nil, err
	}
	out, err := json.MarshalIndent(d, "", "  ")
	return append(out, '\n'), err
}

// orNil: the SDK returns its error list as an error even when the list is empty.
func orNil(err error) error {
	if errs, ok := err.(cog.BuildErrors); ok && len(errs) == 0 {
		return nil
	}
	return err
}

func check(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	plugins.RegisterDefaultPlugins()
	var d dashboard.Dashboard
	if err := orNil(d.UnmarshalJSONStrict(raw)); err != nil {
		return fmt.Errorf("%s does not decode strictly as a Grafana dashboard: %w", path, err)
	}
	if err := orNil(d.Validate()); err != nil {
		return fmt.Errorf("%s is not a valid dashboard: %w", path, err)
	}
	want, err := build()
	if err != nil {
		return err
	}
	if !bytes.Equal(raw, want) {
		return fmt.Errorf("%s differs from what `dashboard gen` writes: regenerate it", path)
	}
	fmt.Println(hostPromQL)
	for _, p := range panels {
		for _, q := range p.queries {
			fmt.Println(q[0])
		}
	}
	return nil
}

func main() {
	var err error
	switch {
	case len(os.Args) == 2 && os.Args[1] == "gen":
		var out []byte
		if out, err = build(); err == nil {
			_, err = os.Stdout.Write(out)
		}
	case len(os.Args) == 3 && os.Args[1] == "check":
		err = check(os.Args[2])
	default:
		fmt.Fprintln(os.Stderr, "usage: dashboard gen | dashboard check FILE")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dashboard:", err)
		os.Exit(1)
	}
}
