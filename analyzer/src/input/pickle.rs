//! A small, strict pickle reader for untrusted input (PyTorch memory snapshots).
//!
//! It builds plain values (None, bools, ints, floats, strings, bytes, lists, tuples, dicts)
//! for protocols 2–5, and represents class references and object construction (`GLOBAL`,
//! `STACK_GLOBAL`, `REDUCE`, `NEWOBJ`, `BUILD`) as inert [`Value::Object`]s: nothing is ever
//! imported or executed. Limits bound work and memory; any violation is an error, never a
//! panic:
//!
//! - nesting deeper than [`MAX_DEPTH`] is refused (a 200 KB file can nest 200,000 tuples);
//!   values are also dropped without recursion ([`Seq`], [`Pairs`]), so no input can make
//!   the reader's stack grow with its nesting;
//! - the stack holds at most [`MAX_STACK`] items and the memo [`MAX_KEPT`] entries;
//! - containers keep at most [`MAX_KEPT`] elements in all: elements past that are counted
//!   ([`Parsed::folded`]) and not kept, so memory stays bounded whatever the file's size.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::rc::Rc;

/// Values created (each opcode creates at most one).
pub const MAX_VALUES: usize = 16_000_000;
/// Entries of a dict searched by [`Value::get`].
pub const MAX_DICT_SCAN: usize = 64;
/// Deepest nesting of containers accepted (a PyTorch snapshot nests about 8 deep).
pub const MAX_DEPTH: u32 = 1_000;
/// Items on the pickle machine's stack at once (`pickle` writes batches of 1,000).
pub const MAX_STACK: usize = 1_000_000;
/// Container elements (list and tuple items, dict pairs) and memo entries kept in all:
/// about 24 bytes each, so at most about 100 MB. Container elements past it are counted,
/// not kept; memo entries past it are an error.
pub const MAX_KEPT: usize = 4_000_000;
/// Elements kept per container: one huge list (a trace) cannot take the whole budget and
/// starve the small containers that give a snapshot its structure.
pub const MAX_CONTAINER: usize = 1_000_000;

/// The elements of a list or tuple. Dropping one never recurses into its elements.
#[derive(Clone, Debug, Default)]
pub struct Seq(pub Vec<Value>);

/// The pairs of a dict. Dropping one never recurses into its keys and values.
#[derive(Clone, Debug, Default)]
pub struct Pairs(pub Vec<(Value, Value)>);

impl Deref for Seq {
    type Target = Vec<Value>;
    fn deref(&self) -> &Vec<Value> {
        &self.0
    }
}
impl DerefMut for Seq {
    fn deref_mut(&mut self) -> &mut Vec<Value> {
        &mut self.0
    }
}
impl Deref for Pairs {
    type Target = Vec<(Value, Value)>;
    fn deref(&self) -> &Vec<(Value, Value)> {
        &self.0
    }
}
impl DerefMut for Pairs {
    fn deref_mut(&mut self) -> &mut Vec<(Value, Value)> {
        &mut self.0
    }
}
impl Drop for Seq {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            release(std::mem::take(&mut self.0));
        }
    }
}
impl Drop for Pairs {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let mut work = Vec::with_capacity(self.0.len() * 2);
            for (k, v) in std::mem::take(&mut self.0) {
                work.push(k);
                work.push(v);
            }
            release(work);
        }
    }
}

#[derive(Clone, Debug)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer that does not fit in i64 (kept approximately).
    BigInt(f64),
    Float(f64),
    Str(Rc<str>),
    Bytes(usize),
    List(Rc<RefCell<Seq>>),
    Tuple(Rc<Seq>),
    Dict(Rc<RefCell<Pairs>>),
    /// A class reference or an object built from one (never executed).
    Object(Rc<str>),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("pickle error at byte {offset}: {reason}")]
pub struct PickleError {
    pub offset: usize,
    pub reason: String,
}

enum Item {
    Mark,
    /// A value and its nesting depth (0 for scalars).
    V(Value, u32),
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Item>,
    memo: Vec<Option<(Value, u32)>>,
    created: usize,
    /// Container elements and memo entries kept so far.
    kept: usize,
    /// Container elements not kept (past [`MAX_KEPT`]).
    folded: u64,
}

impl<'a> Vm<'a> {
    fn err<T>(&self, reason: impl Into<String>) -> Result<T, PickleError> {
        Err(PickleError { offset: self.pos, reason: reason.into() })
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], PickleError> {
        let end = match self.pos.checked_add(n) {
            Some(e) if e <= self.data.len() => e,
            _ => return self.err(format!("needs {n} more bytes than the input has")),
        };
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, PickleError> {
        Ok(self.take(1)?[0])
    }
    fn le(&mut self, n: usize) -> Result<u64, PickleError> {
        let b = self.take(n)?;
        let mut v = 0u64;
        for (i, x) in b.iter().enumerate() {
            v |= u64::from(*x) << (8 * i);
        }
        Ok(v)
    }
    fn len(&mut self, n: usize) -> Result<usize, PickleError> {
        let v = self.le(n)?;
        if v > (self.data.len() - self.pos) as u64 {
            return self.err(format!("length {v} runs past the end of the input"));
        }
        Ok(v as usize)
    }
    fn push(&mut self, v: Value) -> Result<(), PickleError> {
        self.push_d(v, 0)
    }
    /// Pushes a value of nesting depth `depth`.
    fn push_d(&mut self, v: Value, depth: u32) -> Result<(), PickleError> {
        self.created += 1;
        if self.created > MAX_VALUES {
            return self.err("too many values");
        }
        self.depth_ok(depth)?;
        self.stack_room()?;
        self.stack.push(Item::V(v, depth));
        Ok(())
    }
    fn depth_ok(&self, depth: u32) -> Result<(), PickleError> {
        if depth > MAX_DEPTH {
            return self.err(format!("containers nested more than {MAX_DEPTH} deep"));
        }
        Ok(())
    }
    fn stack_room(&self) -> Result<(), PickleError> {
        if self.stack.len() >= MAX_STACK {
            return self.err(format!("more than {MAX_STACK} items on the pickle stack"));
        }
        Ok(())
    }
    /// Elements of a new or grown container that holds `len` already: those past the
    /// budget are counted, not kept.
    fn keep(&mut self, len: usize, mut items: Vec<Value>) -> Vec<Value> {
        let room = MAX_KEPT.saturating_sub(self.kept).min(MAX_CONTAINER.saturating_sub(len));
        if items.len() > room {
            self.folded += (items.len() - room) as u64;
            let rest = items.split_off(room);
            drop_items(rest);
        }
        self.kept += items.len();
        items
    }
    fn pop(&mut self) -> Result<Value, PickleError> {
        self.pop_d().map(|(v, _)| v)
    }
    fn pop_d(&mut self) -> Result<(Value, u32), PickleError> {
        match self.stack.pop() {
            Some(Item::V(v, d)) => Ok((v, d)),
            Some(Item::Mark) => self.err("unexpected mark"),
            None => self.err("stack underflow"),
        }
    }
    fn top(&mut self) -> Result<&mut Value, PickleError> {
        match self.stack.last_mut() {
            Some(Item::V(v, _)) => Ok(v),
            _ => Err(PickleError { offset: self.pos, reason: "no value on the stack".into() }),
        }
    }
    /// The top value (a handle) and its depth.
    fn top_d(&self) -> Result<(Value, u32), PickleError> {
        match self.stack.last() {
            Some(Item::V(v, d)) => Ok((v.clone(), *d)),
            _ => Err(PickleError { offset: self.pos, reason: "no value on the stack".into() }),
        }
    }
    /// The top value's depth grows to hold elements of depth `inner`.
    fn deepen_top(&mut self, inner: u32) -> Result<(), PickleError> {
        let d = inner.saturating_add(1);
        self.depth_ok(d)?;
        if let Some(Item::V(_, top)) = self.stack.last_mut() {
            *top = (*top).max(d);
        }
        Ok(())
    }
    /// Pops everything down to the last mark, with the deepest item's depth.
    fn pop_mark(&mut self) -> Result<(Vec<Value>, u32), PickleError> {
        let Some(m) = self.stack.iter().rposition(|i| matches!(i, Item::Mark)) else {
            return self.err("no mark on the stack");
        };
        let mut depth = 0;
        let items: Vec<Value> = self
            .stack
            .drain(m + 1..)
            .filter_map(|i| match i {
                Item::V(v, d) => {
                    depth = depth.max(d);
                    Some(v)
                }
                Item::Mark => None,
            })
            .collect();
        self.stack.pop();
        Ok((items, depth))
    }
    fn string(&mut self, n: usize) -> Result<Value, PickleError> {
        let b = self.take(n)?;
        Ok(Value::Str(Rc::from(String::from_utf8_lossy(b).as_ref())))
    }
    fn memo_put(&mut self, idx: usize) -> Result<(), PickleError> {
        let v = self.top_d()?;
        // Picklers number the memo in order: an index far past its end is hostile (and
        // would make a huge memo out of a few bytes).
        if idx > self.memo.len() + 1024 || idx > self.data.len() + 16 {
            return self.err("memo index out of range");
        }
        if self.memo.len() <= idx {
            if self.kept + (idx + 1 - self.memo.len()) > MAX_KEPT {
                return self.err(format!("more than {MAX_KEPT} values kept"));
            }
            self.kept += idx + 1 - self.memo.len();
            self.memo.resize(idx + 1, None);
        }
        if let Some(old) = self.memo[idx].replace(v) {
            drop_items(vec![old.0]);
        }
        Ok(())
    }
    fn memo_get(&mut self, idx: usize) -> Result<(), PickleError> {
        match self.memo.get(idx).cloned().flatten() {
            Some((v, d)) => self.push_d(v, d),
            None => self.err(format!("memo {idx} is empty")),
        }
    }
    fn set_items(&mut self, target: &Value, items: Vec<Value>) -> Result<(), PickleError> {
        let Value::Dict(d) = target else { return self.err("SETITEMS on a non-dict") };
        let mut d = d.try_borrow_mut().map_err(|_| PickleError { offset: self.pos, reason: "dict in use".into() })?;
        let mut items = self.keep(d.len() * 2, items);
        if items.len() % 2 == 1 {
            drop_items(vec![items.pop().unwrap_or(Value::None)]);
        }
        let mut it = items.into_iter();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            d.push((k, v));
        }
        Ok(())
    }
    fn append(&mut self, target: &Value, items: Vec<Value>) -> Result<(), PickleError> {
        match target {
            Value::List(l) => {
                let mut l =
                    l.try_borrow_mut().map_err(|_| PickleError { offset: self.pos, reason: "list in use".into() })?;
                let items = self.keep(l.len(), items);
                l.extend(items);
                Ok(())
            }
            Value::Object(_) => {
                drop_items(items);
                Ok(())
            }
            _ => self.err("APPENDS on a non-list"),
        }
    }
}

fn drop_items(items: Vec<Value>) {
    release(items)
}

/// Drops values without recursion, emptying only the containers nothing else holds: a value
/// popped while the memo keeps it (`}…u` `r` `0`, as pickles that share an entry write it)
/// must stay whole for the memo's later references.
pub fn release(vals: Vec<Value>) {
    empty_all(vals, false)
}

/// Drops values without recursion (a hostile pickle can nest a million lists deep, and
/// can make cycles): containers are emptied one by one onto a work list, shared or not,
/// so only for values all of which go at once (a parsed pickle, with its memo).
pub fn teardown(vals: Vec<Value>) {
    empty_all(vals, true)
}

fn empty_all(vals: Vec<Value>, shared_too: bool) {
    let mut work = vals;
    while let Some(v) = work.pop() {
        match v {
            Value::List(l) if shared_too || Rc::strong_count(&l) == 1 => {
                if let Ok(mut b) = l.try_borrow_mut() {
                    work.append(&mut b.0);
                }
            }
            Value::Dict(d) if shared_too || Rc::strong_count(&d) == 1 => {
                if let Ok(mut b) = d.try_borrow_mut() {
                    for (k, v) in std::mem::take(&mut b.0) {
                        work.push(k);
                        work.push(v);
                    }
                }
            }
            Value::Tuple(t) => {
                if let Ok(mut items) = Rc::try_unwrap(t) {
                    work.append(&mut items.0);
                }
            }
            _ => {}
        }
    }
}

/// A parsed pickle; dropping it tears the values down without recursion.
pub struct Parsed {
    pub root: Value,
    /// Container elements that were not kept (past [`MAX_KEPT`] in all).
    pub folded: u64,
    keep: Vec<Value>,
}

impl Drop for Parsed {
    fn drop(&mut self) {
        let mut all = std::mem::take(&mut self.keep);
        all.push(std::mem::replace(&mut self.root, Value::None));
        teardown(all);
    }
}

impl Drop for Vm<'_> {
    fn drop(&mut self) {
        let mut all: Vec<Value> = self.memo.drain(..).flatten().map(|(v, _)| v).collect();
        all.extend(self.stack.drain(..).filter_map(|i| match i {
            Item::V(v, _) => Some(v),
            Item::Mark => None,
        }));
        teardown(all);
    }
}

/// Parses one pickle. Only the first pickle in `data` is read (up to STOP).
pub fn parse(data: &[u8]) -> Result<Parsed, PickleError> {
    let mut vm = Vm { data, pos: 0, stack: Vec::new(), memo: Vec::new(), created: 0, kept: 0, folded: 0 };
    let root = run(&mut vm)?;
    let mut keep: Vec<Value> = vm.memo.drain(..).flatten().map(|(v, _)| v).collect();
    keep.extend(vm.stack.drain(..).filter_map(|i| match i {
        Item::V(v, _) => Some(v),
        Item::Mark => None,
    }));
    Ok(Parsed { root, folded: vm.folded, keep })
}
fn run(vm: &mut Vm<'_>) -> Result<Value, PickleError> {
    loop {
        let op = vm.u8()?;
        match op {
            b'.' => return vm.pop(),
            0x80 | 0x95 | b'N' | 0x88 | 0x89 | b'J' | b'K' | b'M' | 0x8a | 0x8b | b'G' => scalar_op(vm, op)?,
            0x8c | b'U' | b'X' | b'T' | 0x8d | b'C' | b'B' | 0x8e | 0x96 => text_op(vm, op)?,
            b']' | 0x8f | b'}' | b')' | b'(' | b'l' | 0x91 | b't' | b'd' | 0x85..=0x87 => container_op(vm, op)?,
            b'a' | b'e' | 0x90 | b's' | b'u' => fill_op(vm, op)?,
            b'q' | b'r' | 0x94 | b'h' | b'j' | b'0' | b'1' | b'2' => memo_op(vm, op)?,
            b'c' | 0x93 | b'R' | 0x81 | 0x92 | b'b' => object_op(vm, op)?,
            other => return vm.err(format!("unsupported pickle opcode {other:#04x}")),
        }
    }
}

/// Protocol and framing opcodes, and the scalars: None, bools, ints, floats.
fn scalar_op(vm: &mut Vm<'_>, op: u8) -> Result<(), PickleError> {
    match op {
        0x80 => {
            let p = vm.u8()?;
            if p > 5 {
                return vm.err(format!("pickle protocol {p} is newer than 5"));
            }
        }
        0x95 => {
            vm.le(8)?;
        }
        b'N' => vm.push(Value::None)?,
        0x88 => vm.push(Value::Bool(true))?,
        0x89 => vm.push(Value::Bool(false))?,
        b'J' => {
            let v = vm.le(4)? as u32 as i32;
            vm.push(Value::Int(i64::from(v)))?
        }
        b'K' => {
            let v = vm.le(1)?;
            vm.push(Value::Int(v as i64))?
        }
        b'M' => {
            let v = vm.le(2)?;
            vm.push(Value::Int(v as i64))?
        }
        0x8a | 0x8b => {
            let n = if op == 0x8a { vm.u8()? as usize } else { vm.len(4)? };
            let b = vm.take(n)?;
            let v = if n == 0 {
                Value::Int(0)
            } else if n <= 8 {
                let mut v = 0u64;
                for (i, x) in b.iter().enumerate() {
                    v |= u64::from(*x) << (8 * i);
                }
                let shift = 64 - 8 * n as u32;
                Value::Int(((v << shift) as i64) >> shift)
            } else {
                let mut f = 0f64;
                for x in b.iter().rev() {
                    f = f * 256.0 + f64::from(*x);
                }
                if b[n - 1] & 0x80 != 0 {
                    f -= 256f64.powi(n as i32);
                }
                Value::BigInt(f)
            };
            vm.push(v)?
        }
        b'G' => {
            let b = vm.take(8)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            vm.push(Value::Float(f64::from_be_bytes(a)))?
        }
        other => return vm.err(format!("unsupported pickle opcode {other:#04x}")),
    }
    Ok(())
}

/// Strings, and bytes (skipped, kept as their length).
fn text_op(vm: &mut Vm<'_>, op: u8) -> Result<(), PickleError> {
    match op {
        0x8c | b'U' => {
            let n = vm.len(1)?;
            let v = vm.string(n)?;
            vm.push(v)?
        }
        b'X' | b'T' => {
            let n = vm.len(4)?;
            let v = vm.string(n)?;
            vm.push(v)?
        }
        0x8d => {
            let n = vm.len(8)?;
            let v = vm.string(n)?;
            vm.push(v)?
        }
        b'C' | b'B' | 0x8e | 0x96 => {
            let n = match op {
                b'C' => vm.len(1)?,
                b'B' => vm.len(4)?,
                _ => vm.len(8)?,
            };
            vm.take(n)?;
            vm.push(Value::Bytes(n))?
        }
        other => return vm.err(format!("unsupported pickle opcode {other:#04x}")),
    }
    Ok(())
}

/// Marks, and new lists, dicts and tuples (empty, or from the items above a mark).
fn container_op(vm: &mut Vm<'_>, op: u8) -> Result<(), PickleError> {
    match op {
        b']' | 0x8f => vm.push_d(Value::List(Rc::new(RefCell::new(Seq::default()))), 1)?,
        b'}' => vm.push_d(Value::Dict(Rc::new(RefCell::new(Pairs::default()))), 1)?,
        b')' => vm.push_d(Value::Tuple(Rc::new(Seq::default())), 1)?,
        b'(' => {
            vm.created += 1;
            if vm.created > MAX_VALUES {
                return vm.err("too many values");
            }
            vm.stack_room()?;
            vm.stack.push(Item::Mark)
        }
        b'l' | 0x91 => {
            let (items, d) = vm.pop_mark()?;
            let items = vm.keep(0, items);
            vm.push_d(Value::List(Rc::new(RefCell::new(Seq(items)))), d.saturating_add(1))?
        }
        b't' => {
            let (items, d) = vm.pop_mark()?;
            let items = vm.keep(0, items);
            vm.push_d(Value::Tuple(Rc::new(Seq(items))), d.saturating_add(1))?
        }
        b'd' => {
            let (items, depth) = vm.pop_mark()?;
            let d = Value::Dict(Rc::new(RefCell::new(Pairs::default())));
            vm.set_items(&d, items)?;
            vm.push_d(d, depth.saturating_add(1))?
        }
        0x85..=0x87 => {
            let n = (op - 0x84) as usize;
            let mut items = Vec::with_capacity(n);
            let mut depth = 0;
            for _ in 0..n {
                let (v, d) = vm.pop_d()?;
                depth = depth.max(d);
                items.push(v);
            }
            items.reverse();
            let items = vm.keep(0, items);
            vm.push_d(Value::Tuple(Rc::new(Seq(items))), depth.saturating_add(1))?
        }
        other => return vm.err(format!("unsupported pickle opcode {other:#04x}")),
    }
    Ok(())
}

/// Appending to the list, or setting items of the dict, under the items popped.
fn fill_op(vm: &mut Vm<'_>, op: u8) -> Result<(), PickleError> {
    match op {
        b'a' => {
            let (v, d) = vm.pop_d()?;
            let (t, _) = vm.top_d()?;
            vm.deepen_top(d)?;
            vm.append(&t, vec![v])?
        }
        b'e' | 0x90 => {
            let (items, d) = vm.pop_mark()?;
            let (t, _) = vm.top_d()?;
            vm.deepen_top(d)?;
            vm.append(&t, items)?
        }
        b's' => {
            let (v, dv) = vm.pop_d()?;
            let (k, dk) = vm.pop_d()?;
            let (t, _) = vm.top_d()?;
            vm.deepen_top(dv.max(dk))?;
            vm.set_items(&t, vec![k, v])?
        }
        b'u' => {
            let (items, d) = vm.pop_mark()?;
            let (t, _) = vm.top_d()?;
            vm.deepen_top(d)?;
            vm.set_items(&t, items)?
        }
        other => return vm.err(format!("unsupported pickle opcode {other:#04x}")),
    }
    Ok(())
}

/// The memo (put and get), and popping or duplicating the stack.
fn memo_op(vm: &mut Vm<'_>, op: u8) -> Result<(), PickleError> {
    match op {
        // BINPUT / LONG_BINPUT: a 1- or 4-byte memo index.
        b'q' | b'r' => {
            let i = vm.le(if op == b'q' { 1 } else { 4 })? as usize;
            vm.memo_put(i)?
        }
        0x94 => {
            let i = vm.memo.len();
            vm.memo_put(i)?
        }
        // BINGET / LONG_BINGET.
        b'h' | b'j' => {
            let i = vm.le(if op == b'h' { 1 } else { 4 })? as usize;
            vm.memo_get(i)?
        }
        b'0' => {
            let v = vm.pop()?;
            drop_items(vec![v]);
        }
        b'1' => {
            let (items, _) = vm.pop_mark()?;
            drop_items(items);
        }
        b'2' => {
            let (v, d) = vm.top_d()?;
            vm.push_d(v, d)?
        }
        other => return vm.err(format!("unsupported pickle opcode {other:#04x}")),
    }
    Ok(())
}

/// Globals, calls that build objects (kept as the class name), and their state.
fn object_op(vm: &mut Vm<'_>, op: u8) -> Result<(), PickleError> {
    match op {
        b'c' => {
            let mut name = String::new();
            for _ in 0..2 {
                let rest = &vm.data[vm.pos..];
                let Some(nl) = rest.iter().position(|b| *b == b'\n') else {
                    return vm.err("GLOBAL without newline");
                };
                let part = vm.take(nl + 1)?;
                if !name.is_empty() {
                    name.push('.');
                }
                name.push_str(&String::from_utf8_lossy(&part[..nl]));
            }
            vm.push(Value::Object(Rc::from(name.as_str())))?
        }
        0x93 => {
            let n = vm.pop()?;
            let m = vm.pop()?;
            let name = match (m, n) {
                (Value::Str(m), Value::Str(n)) => format!("{m}.{n}"),
                _ => "?".into(),
            };
            vm.push(Value::Object(Rc::from(name.as_str())))?
        }
        b'R' | 0x81 => {
            let args = vm.pop()?;
            drop_items(vec![args]);
            let cls = vm.pop()?;
            let name = match cls {
                Value::Object(n) => n,
                _ => Rc::from("?"),
            };
            vm.push(Value::Object(name))?
        }
        0x92 => {
            let kw = vm.pop()?;
            let args = vm.pop()?;
            drop_items(vec![kw, args]);
            let cls = vm.pop()?;
            let name = match cls {
                Value::Object(n) => n,
                _ => Rc::from("?"),
            };
            vm.push(Value::Object(name))?
        }
        b'b' => {
            let state = vm.pop()?;
            drop_items(vec![state]);
            vm.top()?;
        }
        other => return vm.err(format!("unsupported pickle opcode {other:#04x}")),
    }
    Ok(())
}

impl Value {
    /// A dict's value for a string key, among its first [`MAX_DICT_SCAN`] entries (the
    /// snapshot's dicts have a dozen keys; a hostile one with millions must not make every
    /// lookup a scan).
    pub fn get(&self, key: &str) -> Option<Value> {
        match self {
            Value::Dict(d) => d
                .try_borrow()
                .ok()?
                .iter()
                .take(MAX_DICT_SCAN)
                .find(|(k, _)| matches!(k, Value::Str(s) if &**s == key))
                .map(|(_, v)| v.clone()),
            _ => None,
        }
    }

    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) if *i >= 0 => Some(*i as u64),
            Value::Bool(b) => Some(u64::from(*b)),
            Value::BigInt(f) if *f >= 0.0 && *f < 1.8e19 => Some(*f as u64),
            Value::Float(f) if *f >= 0.0 && *f < 1.8e19 => Some(*f as u64),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<Rc<str>> {
        match self {
            Value::Str(s) => Some(s.clone()),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            Value::BigInt(f) => Some(*f),
            _ => None,
        }
    }

    /// The elements of a list or tuple (a copy of the handles, not of the contents).
    pub fn items(&self) -> Vec<Value> {
        match self {
            Value::List(l) => l.try_borrow().map(|l| l.0.clone()).unwrap_or_default(),
            Value::Tuple(t) => t.0.clone(),
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_garbage_without_panicking() {
        for data in
            [&b""[..], b"\x80", b"\x80\x02]q\x00(", b"\x80\x09.", b"\x80\x02h\x05.", b"\x80\x02X\xff\xff\xff\xff"]
        {
            assert!(parse(data).is_err(), "{data:?}");
        }
    }

    #[test]
    fn deep_nesting_and_cycles_drop_without_recursion() {
        let mut p = vec![0x80, 4, b']'];
        for _ in 0..1_000_000 {
            p.extend_from_slice(b"]a");
        }
        // A list holding itself: EMPTY_LIST, MEMOIZE, BINGET 0, APPEND.
        p.extend_from_slice(&[b'0', b']', 0x94, b'h', 0, b'a', b'.']);
        let _ = parse(&p);
        // Lists nested a million deep: refused at the depth bound, not by the stack.
        let mut q = vec![0x80, 4];
        q.extend(std::iter::repeat_n(b']', 1_000_000));
        q.extend(std::iter::repeat_n(b'a', 999_999));
        q.push(b'.');
        let e = parse(&q).err().expect("too deep");
        assert!(e.reason.contains("nested more than"), "{e}");
        // As deep as allowed still parses.
        let mut ok = vec![0x80, 4];
        ok.extend(std::iter::repeat_n(b']', MAX_DEPTH as usize));
        ok.extend(std::iter::repeat_n(b'a', MAX_DEPTH as usize - 1));
        ok.push(b'.');
        assert!(parse(&ok).is_ok());
    }

    /// Tuples nested 200,000 deep in a 200 KB file (issue 9): a clear error, and neither
    /// parsing nor dropping what was built recurses.
    #[test]
    fn nested_tuples_and_dicts_are_refused_at_the_depth_bound() {
        let mut t = vec![0x80, 2, b')'];
        t.extend(std::iter::repeat_n(0x85u8, 200_000));
        t.push(b'.');
        let e = parse(&t).err().expect("too deep");
        assert!(e.reason.contains("nested more than 1000 deep"), "{e}");
        // Dicts: {'k': {'k': ...}} through SETITEM.
        let mut d = vec![0x80, 2];
        for _ in 0..100_000 {
            d.extend_from_slice(b"}X\x01\x00\x00\x00k");
        }
        d.extend_from_slice(b"N");
        d.extend(std::iter::repeat_n(b's', 100_000));
        d.push(b'.');
        let e = parse(&d).err().expect("too deep");
        assert!(e.reason.contains("nested more than"), "{e}");
        // A deep value built without the depth check (by hand) still drops iteratively.
        let mut v = Value::Tuple(Rc::new(Seq::default()));
        for _ in 0..1_000_000 {
            v = Value::Tuple(Rc::new(Seq(vec![v])));
        }
        drop(v);
    }

    /// Elements past the kept budget are counted, not kept; the stack is bounded too.
    #[test]
    fn huge_lists_are_folded_and_the_stack_is_bounded() {
        let mut p = vec![0x80, 2, b']', b'('];
        let n = MAX_CONTAINER + 5_000;
        for i in 0..n {
            p.extend_from_slice(b"N");
            if i % 1000 == 999 {
                p.extend_from_slice(b"e(");
            }
        }
        p.extend_from_slice(b"e.");
        let parsed = parse(&p).expect("parse");
        assert_eq!(parsed.root.items().len(), MAX_CONTAINER);
        assert_eq!(parsed.folded, (n - MAX_CONTAINER) as u64);
        let mut s = vec![0x80, 2, b'('];
        s.extend(std::iter::repeat_n(b'N', MAX_STACK + 1));
        let e = parse(&s).err().expect("stack");
        assert!(e.reason.contains("pickle stack"), "{e}");
    }

    /// A dict memoized and popped, then referenced twice: both references are the whole
    /// dict (popping it used to empty it for the memo's references too).
    #[test]
    fn a_popped_memoized_value_stays_whole() {
        let mut p = vec![0x80, 2, b'}', b'(', b'X', 1, 0, 0, 0, b'a', b'K', 7, b'u', b'r', 0, 0, 0, 0, b'0'];
        p.extend_from_slice(&[b']', b'(', b'j', 0, 0, 0, 0, b'j', 0, 0, 0, 0, b'e', b'.']);
        let parsed = parse(&p).expect("parse");
        let items = parsed.root.items();
        assert_eq!(items.len(), 2);
        for d in items {
            assert_eq!(d.get("a").and_then(|v| v.as_u64()), Some(7));
        }
    }

    #[test]
    fn reads_dict_list_memo() {
        // pickle.dumps({'a': [1, 300, -2, 2**40], 'b': 'x', 'c': 'x'}, protocol=4) shape, hand-built.
        let mut p = vec![0x80, 4, b'}', 0x94, b'('];
        p.extend_from_slice(&[0x8c, 1, b'a', 0x94, b']', 0x94, b'(', b'K', 1, b'M', 0x2c, 1, b'J']);
        p.extend_from_slice(&(-2i32).to_le_bytes());
        p.extend_from_slice(&[0x8a, 6, 0, 0, 0, 0, 0, 1, b'e']);
        p.extend_from_slice(&[0x8c, 1, b'b', 0x94, 0x8c, 1, b'x', 0x94, 0x8c, 1, b'c', 0x94, b'h', 4, b'u', b'.']);
        let parsed = parse(&p).expect("parse");
        let v = &parsed.root;
        let a = v.get("a").expect("a").items();
        assert_eq!(
            a.iter().map(|x| x.as_f64().unwrap_or(-1.0)).collect::<Vec<_>>(),
            vec![1.0, 300.0, -2.0, 1099511627776.0]
        );
        assert_eq!(v.get("c").and_then(|x| x.as_str()).as_deref(), Some("x"));
    }
}
