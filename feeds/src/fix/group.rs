//! Repeating groups, read by a small static dictionary.
//!
//! A repeating group is a NumInGroup count field followed by that many entries; each entry
//! starts with the group's first ("delimiter") field and holds only the group's member
//! fields, in any order after the delimiter, and nested groups (FIX 4.2 / 4.4 Volume 1,
//! "Repeating Groups"). Without a dictionary the extent of an entry is unknowable, so only
//! the groups in [`GROUPS`] are read as groups; every other field, an unknown group's
//! fields included, stays readable flat through [`Message::fields`].

use thiserror::Error;

use super::reader::{parse_field, Field, Fields, Message};
use super::value::parse_uint;

/// One repeating group: its count tag, its members (the first is the delimiter that starts
/// each entry; nested count tags are members too) and its nested groups.
#[derive(Debug, PartialEq, Eq)]
pub struct GroupSpec {
    /// The NumInGroup tag.
    pub count_tag: u32,
    /// The tags an entry may hold; `members[0]` starts every entry.
    pub members: &'static [u32],
    /// Groups that may appear inside an entry (their count tags are in `members`).
    pub nested: &'static [GroupSpec],
}

/// NoPartySubIDs (802), FIX 4.4 Volume 1, component PtysSubGrp: PartySubID (523),
/// PartySubIDType (803).
pub const NO_PARTY_SUB_IDS: GroupSpec = GroupSpec {
    count_tag: 802,
    members: &[523, 803],
    nested: &[],
};

/// NoPartyIDs (453), FIX 4.4 Volume 1, component Parties: PartyID (448), PartyIDSource
/// (447), PartyRole (452), NoPartySubIDs (802, nested).
pub const NO_PARTY_IDS: GroupSpec = GroupSpec {
    count_tag: 453,
    members: &[448, 447, 452, 802],
    nested: &[NO_PARTY_SUB_IDS],
};

/// NoSides (552) of TradeCaptureReport (AE), FIX 4.4 Volume 5, TrdCapRptSideGrp; the
/// fields our logs use and the common ones: Side (54), OrderID (37), SecondaryOrderID (198),
/// ClOrdID (11), SecondaryClOrdID (526), ListID (66), NoPartyIDs (453, nested), Account (1),
/// AcctIDSource (660), AccountType (581), Commission (12), CommType (13), OrderCapacity
/// (528), PositionEffect (77), Text (58), NetMoney (118), SettlCurrAmt (119), Currency (15),
/// SettlCurrency (120).
pub const NO_SIDES: GroupSpec = GroupSpec {
    count_tag: 552,
    members: &[
        54, 37, 198, 11, 526, 66, 453, 1, 660, 581, 12, 13, 528, 77, 58, 118, 119, 15, 120,
    ],
    nested: &[NO_PARTY_IDS],
};

/// The top-level group dictionary: every group this module reads, outermost first.
pub const GROUPS: &[GroupSpec] = &[NO_SIDES, NO_PARTY_IDS, NO_PARTY_SUB_IDS];

/// The dictionary entry for a count tag, if it is one.
pub fn spec(count_tag: u32) -> Option<&'static GroupSpec> {
    GROUPS.iter().find(|g| g.count_tag == count_tag)
}

/// Why a group did not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum GroupError {
    /// The tag is not a count tag in [`GROUPS`] (or, for a nested read, not nested here).
    #[error("{0} is not a known group count tag")]
    Unknown(u32),
    /// The count field is not there.
    #[error("group count field {0} missing")]
    Missing(u32),
    /// The count value is not a non-negative integer.
    #[error("group count field {0} is not a number")]
    BadCount(u32),
    /// Fewer entries than the count declares: entry `found` does not start with the
    /// delimiter (the group's first member).
    #[error("group {count_tag} declares {declared} entries, {found} start with its delimiter")]
    CountMismatch {
        /// The count tag.
        count_tag: u32,
        /// Its value.
        declared: u64,
        /// Entries found.
        found: u64,
    },
}

/// Skips `count` entries of `spec` at the start of `bytes`; the bytes they take.
fn skip_entries(spec: &GroupSpec, bytes: &[u8], count: u64) -> Result<usize, GroupError> {
    let mut used = 0;
    for found in 0..count {
        used += entry_len(spec, &bytes[used..]).ok_or(GroupError::CountMismatch {
            count_tag: spec.count_tag,
            declared: count,
            found,
        })??;
    }
    Ok(used)
}

/// The length of the entry at the start of `bytes`: `None` if it does not start with the
/// delimiter, an error if a nested group in it is broken.
fn entry_len(spec: &GroupSpec, bytes: &[u8]) -> Option<Result<usize, GroupError>> {
    let (first, mut used) = parse_field(bytes)?;
    if first.tag != spec.members[0] {
        return None;
    }
    while let Some((f, n)) = parse_field(&bytes[used..]) {
        if f.tag == spec.members[0] || !spec.members.contains(&f.tag) {
            break;
        }
        used += n;
        if let Some(inner) = spec.nested.iter().find(|g| g.count_tag == f.tag) {
            let count = match parse_uint(f.value) {
                Ok(c) => c,
                Err(_) => return Some(Err(GroupError::BadCount(f.tag))),
            };
            match skip_entries(inner, &bytes[used..], count) {
                Ok(n) => used += n,
                Err(e) => return Some(Err(e)),
            }
        }
    }
    Some(Ok(used))
}

/// Reads the group whose count field is `count` (already parsed) and whose entries start at
/// `after`.
fn open<'a>(
    spec: &'static GroupSpec,
    count: Field<'_>,
    after: &'a [u8],
) -> Result<Group<'a>, GroupError> {
    let declared = parse_uint(count.value).map_err(|_| GroupError::BadCount(spec.count_tag))?;
    let len = skip_entries(spec, after, declared)?;
    Ok(Group {
        spec,
        rest: &after[..len],
        left: declared,
    })
}

/// The entries of one repeating group, verified against its count when opened.
#[derive(Debug, Clone)]
pub struct Group<'a> {
    spec: &'static GroupSpec,
    rest: &'a [u8],
    left: u64,
}

impl<'a> Group<'a> {
    /// The group's dictionary entry.
    pub fn spec(&self) -> &'static GroupSpec {
        self.spec
    }
}

impl<'a> Iterator for Group<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        if self.left == 0 {
            return None;
        }
        // Opening the group measured every entry, so this cannot fail; a failure ends it.
        let len = match entry_len(self.spec, self.rest)? {
            Ok(n) => n,
            Err(_) => return None,
        };
        self.left -= 1;
        let (entry, rest) = self.rest.split_at(len);
        self.rest = rest;
        Some(Entry {
            spec: self.spec,
            bytes: entry,
        })
    }
}

/// One entry of a group: its fields (nested groups' fields included) in wire order.
#[derive(Debug, Clone, Copy)]
pub struct Entry<'a> {
    spec: &'static GroupSpec,
    bytes: &'a [u8],
}

impl<'a> Entry<'a> {
    /// Every field of the entry, flat, nested groups' fields included.
    pub fn fields(&self) -> Fields<'a> {
        Fields::new(self.bytes)
    }

    /// The value of `tag` at this entry's own level (not inside a nested group).
    pub fn get(&self, tag: u32) -> Option<&'a [u8]> {
        let mut fields = self.fields();
        while let Some(f) = fields.next() {
            if f.tag == tag {
                return Some(f.value);
            }
            if let Some(inner) = self.spec.nested.iter().find(|g| g.count_tag == f.tag) {
                let count = parse_uint(f.value).ok()?;
                let skip = skip_entries(inner, fields.rest(), count).ok()?;
                fields = Fields::new(&fields.rest()[skip..]);
            }
        }
        None
    }

    /// The nested group with `count_tag` in this entry.
    pub fn group(&self, count_tag: u32) -> Result<Group<'a>, GroupError> {
        let spec = self
            .spec
            .nested
            .iter()
            .find(|g| g.count_tag == count_tag)
            .ok_or(GroupError::Unknown(count_tag))?;
        let mut fields = self.fields();
        while let Some(f) = fields.next() {
            if f.tag == count_tag {
                return open(spec, f, fields.rest());
            }
        }
        Err(GroupError::Missing(count_tag))
    }
}

impl<'a> Message<'a> {
    /// The group with `count_tag` from [`GROUPS`], at its first occurrence in the message
    /// (whatever it is nested in); its entries are measured and counted here.
    pub fn group(&self, count_tag: u32) -> Result<Group<'a>, GroupError> {
        let spec = spec(count_tag).ok_or(GroupError::Unknown(count_tag))?;
        let mut fields = self.fields();
        while let Some(f) = fields.next() {
            if f.tag == count_tag {
                return open(spec, f, fields.rest());
            }
        }
        Err(GroupError::Missing(count_tag))
    }
}
