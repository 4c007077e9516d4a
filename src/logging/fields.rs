//! The text of an event, made safe for one line. A message carries values from rows and from
//! the network (an `owner_server` a producer wrote, a queue name an UPDATE left, a reason a
//! handler gave): a newline in one would start a line of its own, which on the journal's
//! stream may begin with a forged `<0>` priority, and a carriage return or an escape sequence
//! would rewrite what a terminal shows. Every output formats fields through [`CleanFields`],
//! which escapes each control character but the tab, so that a line stays one line, whatever
//! its values hold.

use std::borrow::Cow;
use std::fmt;

use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::{DefaultFields, Writer};
use tracing_subscriber::fmt::FormatFields;

/// `text` with each control character but the tab escaped: `\n`, `\r`, and `\u{1b}` for the
/// rest (the C0 and C1 controls and DEL), as Rust writes them.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if needs_escape(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control() && c != '\t'
}

/// The default `key=value` format, its result escaped (see [`escape`]).
#[derive(Debug, Default)]
pub struct CleanFields(DefaultFields);

impl<'writer> FormatFields<'writer> for CleanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        // Formatted without colours first, then escaped: an escape sequence of our own would
        // be escaped too.
        let mut text = String::new();
        self.0.format_fields(Writer::new(&mut text), fields)?;
        writer.write_str(&escape(&text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_are_escaped_and_text_is_kept() {
        assert_eq!(escape("plain text, é, 日本"), "plain text, é, 日本");
        assert!(matches!(escape("plain"), Cow::Borrowed(_)));
        assert_eq!(escape("a\tb"), "a\tb");
        assert_eq!(
            escape("x\n<0>forged\r\x1b]0;t\x07\u{7f}\u{85}"),
            "x\\n<0>forged\\r\\u{1b}]0;t\\u{7}\\u{7f}\\u{85}"
        );
    }
}
