//! Owns turning schema names into Rust identifiers (snake_case, UpperCamelCase,
//! SCREAMING_SNAKE_CASE) that never collide with keywords.
//!
//! Word splitting is `heck`'s: a word ends before an upper-case letter that follows a
//! lower-case letter or digit, or before the last capital of a run followed by a lower-case
//! letter, so acronyms stay whole (`MDEntryPx` → `md_entry_px`, `SecurityID` →
//! `security_id`). On top of `heck` this module only keeps identifiers valid: a leading digit
//! gets a prefix, a keyword a trailing underscore.

use heck::{ToSnakeCase, ToUpperCamelCase};

use crate::ir::Item;

const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "static", "struct", "super", "trait", "true", "try", "type", "typeof",
    "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// `MDEntryPx` → `md_entry_px`; keywords get a trailing underscore.
pub fn snake(name: &str) -> String {
    let mut s = name.to_snake_case();
    if s.starts_with(|c: char| c.is_ascii_digit()) || s.is_empty() {
        s.insert(0, 'f');
    }
    if KEYWORDS.contains(&s.as_str()) {
        s.push('_');
    }
    s
}

/// `MDEntryPx` → `MD_ENTRY_PX`.
pub fn screaming(name: &str) -> String {
    snake(name).trim_end_matches('_').to_ascii_uppercase()
}

/// `PRICENULL9` → `Pricenull9`, `groupSize8Byte` → `GroupSize8Byte`.
pub fn camel(name: &str) -> String {
    let mut s = name.to_upper_camel_case();
    if s.starts_with(|c: char| c.is_ascii_digit()) || s.is_empty() {
        s.insert(0, 'V');
    }
    if s == "Self" {
        s.push('_');
    }
    s
}

/// The Rust variant name of each valid value of an enum, in order: UpperCamelCase, with
/// trailing underscores added until each is unique.
pub fn variants(values: &[Item]) -> Vec<String> {
    let mut names: Vec<String> = Vec::with_capacity(values.len());
    for v in values {
        let mut name = camel(&v.name);
        while names.contains(&name) {
            name.push('_');
        }
        names.push(name);
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_case_keeps_acronyms_whole() {
        for (name, snake_name) in [
            ("MDEntryPx", "md_entry_px"),
            ("NoMDEntries", "no_md_entries"),
            ("SecurityID", "security_id"),
            ("SecurityIDSource", "security_id_source"),
            ("MDIncrementalRefreshBook", "md_incremental_refresh_book"),
            (
                "MDIncrementalRefreshBook32",
                "md_incremental_refresh_book32",
            ),
            ("TransactTime", "transact_time"),
            ("OrderQty", "order_qty"),
            ("uInt8NULL", "u_int8_null"),
            ("blockLength", "block_length"),
            ("type", "type_"),
            ("9Lives", "f9lives"),
        ] {
            assert_eq!(snake(name), snake_name, "{name}");
        }
    }

    #[test]
    fn camel_case_and_screaming() {
        assert_eq!(camel("PRICENULL9"), "Pricenull9");
        assert_eq!(camel("groupSize8Byte"), "GroupSize8Byte");
        assert_eq!(camel("NewOrderSingle514"), "NewOrderSingle514");
        assert_eq!(
            camel("MDIncrementalRefreshBook"),
            "MdIncrementalRefreshBook"
        );
        assert_eq!(camel("0"), "V0");
        assert_eq!(camel("self"), "Self_");
        assert_eq!(screaming("LastTradeMsg"), "LAST_TRADE_MSG");
        assert_eq!(screaming("type"), "TYPE");
    }

    #[test]
    fn variant_names_are_unique() {
        let item = |name: &str| Item {
            name: name.to_owned(),
            description: String::new(),
            value: String::new(),
            since_version: 0,
        };
        assert_eq!(
            variants(&[item("buy"), item("Buy"), item("BUY")]),
            ["Buy", "Buy_", "Buy__"]
        );
    }
}
