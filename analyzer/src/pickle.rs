//! A small, strict pickle reader for untrusted input (PyTorch memory snapshots).
//!
//! It builds plain values (None, bools, ints, floats, strings, bytes, lists, tuples, dicts)
//! for protocols 2–5, and represents class references and object construction (`GLOBAL`,
//! `STACK_GLOBAL`, `REDUCE`, `NEWOBJ`, `BUILD`) as inert [`Value::Object`]s: nothing is ever
//! imported or executed. Limits bound work and memory; any violation is an error, never a
//! panic.

use std::cell::RefCell;
use std::rc::Rc;

/// Values created (each opcode creates at most one).
pub const MAX_VALUES: usize = 16_000_000;
/// Entries of a dict searched by [`Value::get`].
pub const MAX_DICT_SCAN: usize = 64;

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
    List(Rc<RefCell<Vec<Value>>>),
    Tuple(Rc<Vec<Value>>),
    Dict(Rc<RefCell<Vec<(Value, Value)>>>),
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
    V(Value),
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Item>,
    memo: Vec<Option<Value>>,
    created: usize,
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
        self.created += 1;
        if self.created > MAX_VALUES {
            return self.err("too many values");
        }
        self.stack.push(Item::V(v));
        Ok(())
    }
    fn pop(&mut self) -> Result<Value, PickleError> {
        match self.stack.pop() {
            Some(Item::V(v)) => Ok(v),
            Some(Item::Mark) => self.err("unexpected mark"),
            None => self.err("stack underflow"),
        }
    }
    fn top(&mut self) -> Result<&mut Value, PickleError> {
        match self.stack.last_mut() {
            Some(Item::V(v)) => Ok(v),
            _ => Err(PickleError { offset: self.pos, reason: "no value on the stack".into() }),
        }
    }
    /// Pops everything down to the last mark.
    fn pop_mark(&mut self) -> Result<Vec<Value>, PickleError> {
        let Some(m) = self.stack.iter().rposition(|i| matches!(i, Item::Mark)) else {
            return self.err("no mark on the stack");
        };
        let items: Vec<Value> = self
            .stack
            .drain(m + 1..)
            .filter_map(|i| match i {
                Item::V(v) => Some(v),
                Item::Mark => None,
            })
            .collect();
        self.stack.pop();
        Ok(items)
    }
    fn string(&mut self, n: usize) -> Result<Value, PickleError> {
        let b = self.take(n)?;
        Ok(Value::Str(Rc::from(String::from_utf8_lossy(b).as_ref())))
    }
    fn memo_put(&mut self, idx: usize) -> Result<(), PickleError> {
        let v = self.top()?.clone();
        if idx > self.data.len() + 16 {
            return self.err("memo index out of range");
        }
        if self.memo.len() <= idx {
            self.memo.resize(idx + 1, None);
        }
        self.memo[idx] = Some(v);
        Ok(())
    }
    fn memo_get(&mut self, idx: usize) -> Result<(), PickleError> {
        match self.memo.get(idx).cloned().flatten() {
            Some(v) => self.push(v),
            None => self.err(format!("memo {idx} is empty")),
        }
    }
    fn set_items(&mut self, target: &Value, items: Vec<Value>) -> Result<(), PickleError> {
        let Value::Dict(d) = target else { return self.err("SETITEMS on a non-dict") };
        let mut d = d.try_borrow_mut().map_err(|_| PickleError { offset: self.pos, reason: "dict in use".into() })?;
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
                l.extend(items);
                Ok(())
            }
            Value::Object(_) => Ok(()),
            _ => self.err("APPENDS on a non-list"),
        }
    }
}

/// Drops values without recursion (a hostile pickle can nest a million lists deep, and
/// can make cycles): containers are emptied one by one onto a work list.
pub fn teardown(vals: Vec<Value>) {
    let mut work = vals;
    while let Some(v) = work.pop() {
        match v {
            Value::List(l) => {
                if let Ok(mut b) = l.try_borrow_mut() {
                    work.extend(std::mem::take(&mut *b));
                }
            }
            Value::Dict(d) => {
                if let Ok(mut b) = d.try_borrow_mut() {
                    for (k, v) in std::mem::take(&mut *b) {
                        work.push(k);
                        work.push(v);
                    }
                }
            }
            Value::Tuple(t) => {
                if let Ok(items) = Rc::try_unwrap(t) {
                    work.extend(items);
                }
            }
            _ => {}
        }
    }
}

/// A parsed pickle; dropping it tears the values down without recursion.
pub struct Parsed {
    pub root: Value,
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
        let mut all: Vec<Value> = self.memo.drain(..).flatten().collect();
        all.extend(self.stack.drain(..).filter_map(|i| match i {
            Item::V(v) => Some(v),
            Item::Mark => None,
        }));
        teardown(all);
    }
}

/// Parses one pickle. Only the first pickle in `data` is read (up to STOP).
pub fn parse(data: &[u8]) -> Result<Parsed, PickleError> {
    let mut vm = Vm { data, pos: 0, stack: Vec::new(), memo: Vec::new(), created: 0 };
    let root = run(&mut vm)?;
    let mut keep: Vec<Value> = vm.memo.drain(..).flatten().collect();
    keep.extend(vm.stack.drain(..).filter_map(|i| match i {
        Item::V(v) => Some(v),
        Item::Mark => None,
    }));
    Ok(Parsed { root, keep })
}

fn run(vm: &mut Vm<'_>) -> Result<Value, PickleError> {
    loop {
        let op = vm.u8()?;
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
            b'.' => return vm.pop(),
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
            b']' => vm.push(Value::List(Rc::new(RefCell::new(Vec::new()))))?,
            b'}' => vm.push(Value::Dict(Rc::new(RefCell::new(Vec::new()))))?,
            b')' => vm.push(Value::Tuple(Rc::new(Vec::new())))?,
            0x8f => vm.push(Value::List(Rc::new(RefCell::new(Vec::new()))))?,
            b'(' => {
                vm.created += 1;
                if vm.created > MAX_VALUES {
                    return vm.err("too many values");
                }
                vm.stack.push(Item::Mark)
            }
            b'a' => {
                let v = vm.pop()?;
                let t = vm.top()?.clone();
                vm.append(&t, vec![v])?
            }
            b'e' | 0x90 => {
                let items = vm.pop_mark()?;
                let t = vm.top()?.clone();
                vm.append(&t, items)?
            }
            b's' => {
                let v = vm.pop()?;
                let k = vm.pop()?;
                let t = vm.top()?.clone();
                vm.set_items(&t, vec![k, v])?
            }
            b'u' => {
                let items = vm.pop_mark()?;
                let t = vm.top()?.clone();
                vm.set_items(&t, items)?
            }
            b'l' => {
                let items = vm.pop_mark()?;
                vm.push(Value::List(Rc::new(RefCell::new(items))))?
            }
            0x91 => {
                let items = vm.pop_mark()?;
                vm.push(Value::List(Rc::new(RefCell::new(items))))?
            }
            b't' => {
                let items = vm.pop_mark()?;
                vm.push(Value::Tuple(Rc::new(items)))?
            }
            b'd' => {
                let items = vm.pop_mark()?;
                let d = Value::Dict(Rc::new(RefCell::new(Vec::new())));
                vm.set_items(&d, items)?;
                vm.push(d)?
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(vm.pop()?);
                }
                items.reverse();
                vm.push(Value::Tuple(Rc::new(items)))?
            }
            b'q' => {
                let i = vm.le(1)? as usize;
                vm.memo_put(i)?
            }
            b'r' => {
                let i = vm.le(4)? as usize;
                vm.memo_put(i)?
            }
            0x94 => {
                let i = vm.memo.len();
                vm.memo_put(i)?
            }
            b'h' => {
                let i = vm.le(1)? as usize;
                vm.memo_get(i)?
            }
            b'j' => {
                let i = vm.le(4)? as usize;
                vm.memo_get(i)?
            }
            b'0' => {
                vm.pop()?;
            }
            b'1' => {
                vm.pop_mark()?;
            }
            b'2' => {
                let v = vm.top()?.clone();
                vm.push(v)?
            }
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
                let _args = vm.pop()?;
                let cls = vm.pop()?;
                let name = match cls {
                    Value::Object(n) => n,
                    _ => Rc::from("?"),
                };
                vm.push(Value::Object(name))?
            }
            0x92 => {
                let _kw = vm.pop()?;
                let _args = vm.pop()?;
                let cls = vm.pop()?;
                let name = match cls {
                    Value::Object(n) => n,
                    _ => Rc::from("?"),
                };
                vm.push(Value::Object(name))?
            }
            b'b' => {
                let _state = vm.pop()?;
                vm.top()?;
            }
            other => return vm.err(format!("unsupported pickle opcode {other:#04x}")),
        }
    }
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
            Value::List(l) => l.try_borrow().map(|l| l.clone()).unwrap_or_default(),
            Value::Tuple(t) => t.as_ref().clone(),
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
        let mut q = vec![0x80, 4];
        q.extend(std::iter::repeat_n(b']', 1_000_000));
        q.extend(std::iter::repeat_n(b'a', 999_999));
        q.push(b'.');
        assert!(parse(&q).is_ok());
        q.pop();
        assert!(parse(&q).is_err());
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
