//! Where a fill-in-the-middle answer stops when the model does not end the middle itself, as IDE
//! completion engines stop it: where the output reaches the suffix's first non-blank whole line,
//! or starts a line less indented than the cursor's block (it left the block: the test code, a
//! Markdown fence or another function a model runs on with). A model that runs on past the middle
//! writes such code next (llama-server's `/infill` failure). Both are stop strings: the engine
//! stops there and never sends them, nor bills past them; the line break the stop string took is
//! given back where the suffix does not start with one.

/// The stop strings a FIM request adds, and what the answer gets back when one stops it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FimStop {
    /// The suffix's first non-blank whole line after a line break (indentation included, trailing
    /// whitespace left off), then one line break and a less indented start per character a line
    /// may start with.
    pub stops: Vec<String>,
    /// Appended to an answer one of `stops` ended: `"\n"` where the cursor was at a line's start
    /// and the suffix does not begin with a line break (the cut break was the middle's last).
    pub tail: &'static str,
}

/// The characters a dedented line may start with: printable ASCII but space.
const LINE_STARTS: std::ops::RangeInclusive<u8> = b'!'..=b'~';

/// The deepest indentation limit [`indent_stops`] draws: llama.cpp's `n_indent` is the cursor
/// line's indentation, and each level costs the stop matcher about 190 strings.
pub const MAX_INDENT: u32 = 16;

/// llama.cpp's `n_indent` as stop strings: after a line break, fewer than `n_indent` spaces or
/// tabs, then anything but a space or tab (a blank line too, as llama.cpp counts it), for a
/// limit of at most [`MAX_INDENT`]. A line indented with spaces and tabs mixed is not seen.
/// llama-server keeps the line break and the indentation it cut after: the matched stop string
/// but its last character (ASCII) is what the answer gets back.
pub fn indent_stops(n_indent: u32) -> Vec<String> {
    let starts = || LINE_STARTS.chain([b'\n']).map(char::from);
    let mut stops: Vec<String> = starts().map(|c| format!("\n{c}")).collect();
    for width in 1..n_indent.min(MAX_INDENT) as usize {
        for pad in [" ", "\t"] {
            stops.extend(starts().map(|c| format!("\n{}{c}", pad.repeat(width))));
        }
    }
    if n_indent == 0 {
        stops.clear();
    }
    stops
}

impl FimStop {
    /// The rule for a middle between `prefix` and `suffix`; `None` where neither part applies.
    pub fn for_suffix(prefix: &str, suffix: &str) -> Option<Self> {
        let mut stops: Vec<String> = suffix_line(prefix, suffix).into_iter().collect();
        for indent in outer_indents(prefix) {
            stops.extend(LINE_STARTS.map(|c| format!("\n{indent}{}", c as char)));
        }
        if stops.is_empty() {
            return None;
        }
        let at_line_start = prefix.is_empty() || prefix.ends_with('\n');
        let tail = if at_line_start && !suffix.starts_with('\n') { "\n" } else { "" };
        Some(Self { stops, tail })
    }
}

/// A line break and the suffix's first non-blank whole line (the rest of the cursor's own line
/// is not one: text such as `)` would stop the middle at its first bracket).
fn suffix_line(prefix: &str, suffix: &str) -> Option<String> {
    let at_line_start = prefix.is_empty() || prefix.ends_with('\n');
    let line = suffix.split('\n').skip(usize::from(!at_line_start)).map(str::trim_end).find(|l| !l.is_empty())?;
    Some(format!("\n{line}"))
}

fn indent_of(line: &str) -> &str {
    &line[..line.len() - line.trim_start_matches([' ', '\t']).len()]
}

/// The indentations, used in the prefix, of the lines outside the cursor's block: a line the
/// middle starts with one of them (and then code) has left the block. The block is the cursor
/// line's indentation; at an empty line, the last non-blank line's, or deeper where that line
/// opens a block (ends with `:`, `{`, `(`, `[`). At the top level nothing is outside.
fn outer_indents(prefix: &str) -> Vec<&str> {
    let mut lines = prefix.split('\n').rev();
    let cursor = lines.next().unwrap_or("");
    let (block, opener) = if !cursor.is_empty() {
        (indent_of(cursor), false)
    } else {
        match lines.clone().find(|l| !l.trim().is_empty()) {
            None => return Vec::new(),
            Some(last) => (indent_of(last), last.trim_end().ends_with([':', '{', '(', '['])),
        }
    };
    let outside = |i: &str| (i.len() < block.len() && block.starts_with(i)) || (opener && i == block);
    let mut indents: Vec<&str> =
        prefix.split('\n').filter(|l| !l.trim().is_empty()).map(indent_of).filter(|i| outside(i)).collect();
    indents.push("");
    indents.retain(|i| outside(i));
    indents.sort_unstable();
    indents.dedup();
    indents
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The middle a model wrote, run on, cut by the rule as the engine cuts at the first stop
    /// string, then the file as the editor puts it together.
    fn filled(prefix: &str, suffix: &str, run_on: &str) -> String {
        let r = FimStop::for_suffix(prefix, suffix).unwrap();
        let cut = r.stops.iter().filter_map(|s| run_on.find(s.as_str())).min();
        let (middle, tail) = match cut {
            Some(at) => (&run_on[..at], r.tail),
            None => (run_on, ""),
        };
        format!("{prefix}{middle}{tail}{suffix}")
    }

    #[test]
    fn the_indentation_limit_stops_a_line_indented_less_or_blank() {
        assert!(indent_stops(0).is_empty());
        let stops = indent_stops(4);
        let cut = |text: &str| stops.iter().filter_map(|s| text.find(s.as_str())).min();
        // The first line is never checked; deeper lines go on.
        assert_eq!(cut("x = 1\n    y = 2\n        z = 3"), None);
        assert_eq!(cut("x = 1\n    y = 2\n  z = 3"), Some(15));
        // A tab counts as one, as llama.cpp counts it.
        assert_eq!(cut("x = 1\n\t\t\t\ty\nz"), Some(11));
        assert_eq!(cut("x = 1\n\t\t\ty"), Some(5));
        assert_eq!(cut("x = 1\n\n    y"), Some(5));
        assert_eq!(indent_stops(100).len(), indent_stops(MAX_INDENT).len());
        assert_eq!(indent_stops(2).len(), 3 * 95);
    }

    #[test]
    fn the_suffix_line_is_its_first_non_blank_whole_line() {
        assert_eq!(suffix_line("def f(x):\n    y = ", "\n    return y\n").as_deref(), Some("\n    return y"));
        assert_eq!(suffix_line("a = 1\n", "\n  \n\nprint(a)  \r\n").as_deref(), Some("\nprint(a)"));
        assert_eq!(suffix_line("def f(x):\n", "    return y\n").as_deref(), Some("\n    return y"));
        // The cursor line's rest is not a whole line.
        assert_eq!(suffix_line("print(", ")\n"), None);
        assert_eq!(suffix_line("print(", ")\nreturn 1\n").as_deref(), Some("\nreturn 1"));
        assert_eq!(suffix_line("x\n", "  \n"), None);
    }

    #[test]
    fn the_block_is_the_cursor_lines_or_the_one_the_last_line_opens() {
        assert_eq!(outer_indents("class A:\n    def f(self):\n        y = "), vec!["", "    "]);
        assert_eq!(outer_indents("def f():\n    \"\"\"Doc.\"\"\"\n"), vec![""]);
        // A line that opens a block: its own indentation is outside.
        assert_eq!(outer_indents("class A:\n    def f(self):\n"), vec!["", "    "]);
        assert_eq!(outer_indents("def f():\n"), vec![""]);
        // Top level: nothing is outside, no stop.
        assert!(outer_indents("import os\n").is_empty() && outer_indents("").is_empty());
        assert!(FimStop::for_suffix("import os\n", "").is_none());
    }

    #[test]
    fn a_run_on_middle_is_cut_where_the_suffix_starts() {
        let (prefix, suffix) = ("def f(x):\n    y = ", "\n    return y\n");
        let file = filled(prefix, suffix, "x * 2\n    return y\n\nprint(f(2))");
        assert_eq!(file, "def f(x):\n    y = x * 2\n    return y\n");
        // Cursor at a line's start: the middle's last line break is given back.
        let (prefix, suffix) = ("def f(x):\n", "    return y\n");
        let file = filled(prefix, suffix, "    y = x * 2\n    return y\n");
        assert_eq!(file, "def f(x):\n    y = x * 2\n    return y\n");
        // The same line at another indentation is not the suffix's.
        let file = filled(prefix, suffix, "    if x:\n        return y\n    y = 1\n    return y");
        assert_eq!(file, "def f(x):\n    if x:\n        return y\n    y = 1\n    return y\n");
    }

    #[test]
    fn a_run_on_middle_is_cut_where_it_leaves_the_block() {
        let prefix = "def is_even(n):\n    \"\"\"Doc.\"\"\"\n";
        let suffix = "\n\nassert is_even(2)\n";
        let file = filled(prefix, suffix, "    return n % 2 == 0\n\n# Test cases\nprint(is_even(3))\n");
        assert_eq!(file, format!("{prefix}    return n % 2 == 0\n{suffix}"));
        let file = filled(prefix, suffix, "    return n % 2 == 0\n```\n");
        assert_eq!(file, format!("{prefix}    return n % 2 == 0{suffix}"));
        // Deeper lines and blank lines stay.
        let body = "    for i in range(n):\n        pass\n\n    return True";
        assert_eq!(filled(prefix, suffix, body), format!("{prefix}{body}{suffix}"));
    }
}
