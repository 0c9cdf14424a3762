//! Walking simd-json's tape: object fields, integers, and lists of keys.
//!
//! The tape is flat: one node per JSON value, containers carrying the size of
//! their subtree, so a value is a slice of the tape and skipping one is an
//! index jump.

use super::{DecodeError, Limits};
use crate::core::KeyRef;
use simd_json::{Node, StaticNode};

/// Number of tape nodes a value occupies, its own node included.
pub(super) fn span(node: &Node<'_>) -> usize {
    match node {
        Node::Object { count, .. } | Node::Array { count, .. } => count.saturating_add(1),
        _ => 1,
    }
}

/// The tape slice of the value that starts at `at`, if the tape holds it.
pub(super) fn value_at<'t, 'a>(tape: &'t [Node<'a>], at: usize) -> Option<&'t [Node<'a>]> {
    let end = at.checked_add(span(tape.get(at)?))?;
    tape.get(at..end)
}

/// Finds the named top-level fields of the root object. Each result is the
/// tape slice of the field's value, taken from its last occurrence; fields not
/// named are skipped without being looked at.
pub(super) fn fields<'t, 'a, const N: usize>(
    tape: &'t [Node<'a>],
    names: [&str; N],
) -> Result<[Option<&'t [Node<'a>]>; N], DecodeError> {
    let Some(Node::Object { len, .. }) = tape.first() else {
        return Err(DecodeError::NotAnObject);
    };
    let mut found = [None; N];
    let mut at = 1usize;
    for _ in 0..*len {
        let Some(Node::String(name)) = tape.get(at) else {
            break; // Cannot happen on a tape from simd-json.
        };
        let Some(value) = value_at(tape, at.saturating_add(1)) else {
            break;
        };
        if let Some(slot) = names.iter().position(|n| n == name).and_then(|i| found.get_mut(i)) {
            *slot = Some(value);
        }
        at = at.saturating_add(1).saturating_add(value.len());
    }
    Ok(found)
}

/// Reads an integer node as `i64`.
pub(super) fn int_of(node: &StaticNode) -> Result<i64, IntError> {
    match node {
        StaticNode::I64(v) => Ok(*v),
        StaticNode::U64(v) => i64::try_from(*v).map_err(|_| IntError::OutOfRange),
        _ => Err(IntError::NotInteger),
    }
}

/// Why a node is not an `i64`.
pub(super) enum IntError {
    /// It is not a JSON integer at all.
    NotInteger,
    /// It is an integer above `i64::MAX`.
    OutOfRange,
}

/// Reads the integer field `field`, with the field-naming error texts.
pub(super) fn int_field(node: &Node<'_>, field: &'static str) -> Result<i64, DecodeError> {
    match node {
        Node::Static(s) => int_of(s).map_err(|e| match e {
            IntError::NotInteger => DecodeError::ExpectedInteger { field },
            IntError::OutOfRange => DecodeError::IntegerOutOfRange { field },
        }),
        _ => Err(DecodeError::ExpectedInteger { field }),
    }
}

/// The shared top level of allocate and locations (and the reference's
/// check order): `rank` missing or null, or the list missing or not a list,
/// is the "Invalid request format" error; only then is `rank`'s type checked.
pub(super) fn rank_and_list<'t, 'a>(
    rank: Option<&'t [Node<'a>]>,
    list: Option<&'t [Node<'a>]>,
    name: &'static str,
) -> Result<(i64, Items<'t, 'a>), DecodeError> {
    let format = DecodeError::InvalidRequestFormat { list: name };
    let items = list.and_then(Items::of);
    let (Some(rank), Some(items)) = (rank.and_then(|v| v.first()), items) else {
        return Err(format);
    };
    if matches!(rank, Node::Static(StaticNode::Null)) {
        return Err(format);
    }
    Ok((int_field(rank, "rank")?, items))
}

/// Refuses a key list longer than the limit, before anything is allocated.
pub(super) fn check_count(items: &Items<'_, '_>, limits: Limits) -> Result<(), DecodeError> {
    if items.len() > limits.max_keys {
        return Err(DecodeError::TooManyKeys { count: items.len(), limit: limits.max_keys });
    }
    Ok(())
}

/// Refuses an empty key (with the list's own error `empty`) or one longer
/// than the limit.
pub(super) fn check_key(key: &str, index: usize, limits: Limits, empty: DecodeError) -> Result<(), DecodeError> {
    if key.is_empty() {
        return Err(empty);
    }
    if key.len() > limits.max_key_len {
        return Err(DecodeError::KeyTooLong { index, len: key.len(), limit: limits.max_key_len });
    }
    Ok(())
}

/// Collects a list whose items must all be key strings (exists, locations).
pub(super) fn key_strings<'a>(items: Items<'_, 'a>, limits: Limits) -> Result<Vec<&'a str>, DecodeError> {
    check_count(&items, limits)?;
    let mut keys = Vec::with_capacity(items.len());
    for (index, item) in items.enumerate() {
        let Some(Node::String(key)) = item.first() else {
            return Err(DecodeError::KeyNotString { index });
        };
        check_key(key, index, limits, DecodeError::EmptyKey { index })?;
        keys.push(*key);
    }
    Ok(keys)
}

/// [`key_strings`], each key classified ([`KeyRef::parse`]): the lists of
/// keys to look up (exists, locations, SGLang's exists and page indices).
pub(super) fn lookups<'a>(items: Items<'_, 'a>, limits: Limits) -> Result<Vec<KeyRef<'a>>, DecodeError> {
    Ok(key_strings(items, limits)?.into_iter().map(KeyRef::parse).collect())
}

/// The items of a JSON array on the tape, each yielded as the tape slice of
/// the whole item, so nested values are skipped in one step.
pub(super) struct Items<'t, 'a> {
    /// Tape nodes from the next item to the end of the tape.
    rest: &'t [Node<'a>],
    /// Items not yet yielded.
    left: usize,
}

impl<'t, 'a> Items<'t, 'a> {
    /// A list with no items (the default of an absent list field).
    pub(super) const EMPTY: Self = Self { rest: &[], left: 0 };

    /// The items of `value`, or `None` when it is not an array.
    pub(super) fn of(value: &'t [Node<'a>]) -> Option<Self> {
        match value.split_first() {
            Some((Node::Array { len, .. }, rest)) => Some(Self { rest, left: *len }),
            _ => None,
        }
    }

    /// Items not yet yielded (the array's length before iteration starts).
    pub(super) fn len(&self) -> usize {
        self.left
    }
}

impl<'t, 'a> Iterator for Items<'t, 'a> {
    type Item = &'t [Node<'a>];

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        let (item, rest) = self.rest.split_at_checked(span(self.rest.first()?))?;
        self.rest = rest;
        self.left -= 1;
        Some(item)
    }
}
