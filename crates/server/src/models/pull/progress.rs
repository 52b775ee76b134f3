//! What a pull tells the person waiting: messages on stderr and a progress bar.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// An informational message, unless `quiet`.
pub(super) fn say(quiet: bool, msg: impl AsRef<str>) {
    if !quiet {
        eprintln!("{}", msg.as_ref());
    }
}

/// A progress bar on a terminal (a spinner without `total`); hidden when `quiet` or piped.
pub(super) fn progress_bar(total: Option<u64>, label: &str, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let (bar, template) = match total {
        Some(total) => {
            (ProgressBar::new(total), "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}")
        }
        None => (ProgressBar::new_spinner(), "{msg} {spinner} {bytes} {binary_bytes_per_sec}"),
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(label.to_string());
    bar
}
