//! Verdicts and outcomes are named in JSON by their snake_case names, while checkpoints
//! (postcard) keep encoding them by variant index: renaming them for JSON changes no
//! checkpoint byte, so an agent's checkpoints from before the rename still read back.

use vramhook_model::{Outcome, Verdict};

#[test]
fn postcard_encodes_the_variant_index_not_the_name() {
    for (i, v) in Verdict::ALL.iter().enumerate() {
        assert_eq!(postcard::to_allocvec(v).unwrap(), vec![i as u8], "{}", v.name());
        assert_eq!(postcard::from_bytes::<Verdict>(&[i as u8]).unwrap(), *v);
    }
    for (i, o) in Outcome::ALL.iter().enumerate() {
        assert_eq!(postcard::to_allocvec(o).unwrap(), vec![i as u8], "{}", o.name());
        assert_eq!(postcard::from_bytes::<Outcome>(&[i as u8]).unwrap(), *o);
    }
}

#[test]
fn names_are_snake_case_and_distinct() {
    let names: Vec<&str> = Verdict::ALL.iter().map(|v| v.name()).chain(Outcome::ALL.iter().map(|o| o.name())).collect();
    for n in &names {
        assert!(n.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{n}");
    }
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), names.len(), "{names:?}");
}
