//! Owns turning schema names into Rust identifiers (snake_case, UpperCamelCase,
//! SCREAMING_SNAKE_CASE) that never collide with keywords.

const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "static", "struct", "super", "trait", "true", "try", "type", "typeof",
    "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Splits `MDEntryPx` into `["md", "entry", "px"]`, `uInt8NULL` into `["u", "int8", "null"]`.
fn words(name: &str) -> Vec<String> {
    let chars: Vec<char> = name.chars().collect();
    let mut words = Vec::new();
    let mut current = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if !c.is_ascii_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            continue;
        }
        if c.is_ascii_uppercase() && i > 0 && !current.is_empty() {
            let prev = chars[i - 1];
            let next_lower = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
            if prev.is_ascii_lowercase()
                || prev.is_ascii_digit()
                || (prev.is_ascii_uppercase() && next_lower)
            {
                words.push(std::mem::take(&mut current));
            }
        }
        current.push(c.to_ascii_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// `MDEntryPx` → `md_entry_px`; keywords get a trailing underscore.
pub fn snake(name: &str) -> String {
    let mut s = words(name).join("_");
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
    let mut s: String = words(name)
        .iter()
        .map(|w| {
            let mut cs = w.chars();
            cs.next()
                .map(|f| f.to_ascii_uppercase().to_string() + cs.as_str())
                .unwrap_or_default()
        })
        .collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) || s.is_empty() {
        s.insert(0, 'V');
    }
    if s == "Self" {
        s.push('_');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_case_splits_acronyms() {
        assert_eq!(snake("MDEntryPx"), "md_entry_px");
        assert_eq!(snake("NoMDEntries"), "no_md_entries");
        assert_eq!(snake("SecurityIDSource"), "security_id_source");
        assert_eq!(
            snake("MDIncrementalRefreshBook32"),
            "md_incremental_refresh_book32"
        );
        assert_eq!(snake("blockLength"), "block_length");
        assert_eq!(snake("type"), "type_");
    }

    #[test]
    fn camel_case_and_screaming() {
        assert_eq!(camel("PRICENULL9"), "Pricenull9");
        assert_eq!(camel("groupSize8Byte"), "GroupSize8Byte");
        assert_eq!(camel("NewOrderSingle514"), "NewOrderSingle514");
        assert_eq!(camel("0"), "V0");
        assert_eq!(screaming("LastTradeMsg"), "LAST_TRADE_MSG");
    }
}
