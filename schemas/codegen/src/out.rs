//! Owns the text buffer generated code is written into: indentation and doc comments.

/// An indented line writer.
#[derive(Default)]
pub struct Out {
    text: String,
    depth: usize,
}

impl Out {
    /// Writes one line at the current indentation (empty lines stay empty).
    pub fn line(&mut self, s: impl AsRef<str>) {
        let s = s.as_ref();
        if !s.is_empty() {
            for _ in 0..self.depth {
                self.text.push_str("    ");
            }
            self.text.push_str(s);
        }
        self.text.push('\n');
    }

    /// Writes `s` (which ends in `{`) and indents.
    pub fn open(&mut self, s: impl AsRef<str>) {
        self.line(s);
        self.depth += 1;
    }

    /// Dedents and writes `s` (which starts with `}`).
    pub fn close(&mut self, s: impl AsRef<str>) {
        self.depth = self.depth.saturating_sub(1);
        self.line(s);
    }

    /// Writes `text` as a `///` doc line, whitespace collapsed; nothing if it is empty.
    /// Brackets outside code spans are escaped, so schema text never forms a link.
    pub fn doc(&mut self, text: &str) {
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() {
            return;
        }
        let mut escaped = String::with_capacity(text.len());
        let mut in_code = false;
        for c in text.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code && (c == '[' || c == ']') {
                escaped.push('\\');
            }
            escaped.push(c);
        }
        self.line(format!("/// {escaped}"));
    }

    /// Writes an empty `///` line (paragraph break in a doc comment).
    pub fn doc_break(&mut self) {
        self.line("///");
    }

    /// The text written so far.
    pub fn finish(self) -> String {
        self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indents_and_collapses_docs() {
        let mut o = Out::default();
        o.doc("a\n   b [x] `&[u8]`");
        o.open("fn f() {");
        o.line("g();");
        o.line("");
        o.close("}");
        assert_eq!(
            o.finish(),
            "/// a b \\[x\\] `&[u8]`\nfn f() {\n    g();\n\n}\n"
        );
    }
}
