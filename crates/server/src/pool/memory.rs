//! The memory budget: parsing `--max-memory`, its default, and what this process holds.

/// A size flag: `700MB`, `4GiB`, `1.5G`, `123456` (bytes), decimal and binary units as
/// `bytesize` reads them; 0 is allowed.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    match s.parse::<u64>() {
        Ok(n) => Ok(n),
        Err(_) => s
            .parse::<bytesize::ByteSize>()
            .map(|b| b.as_u64())
            .map_err(|e| format!("{s:?} is not a size like 700MB or 4GiB: {e}")),
    }
}

/// `--max-memory`: a size ([`parse_size`]) above 0.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    match parse_size(s)? {
        0 => Err("the memory budget must be more than 0 bytes".into()),
        bytes => Ok(bytes),
    }
}

/// Bytes the kernel says can be allocated without swapping (`MemAvailable`).
pub fn available_memory() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_field(&meminfo, "MemAvailable:")
}

/// The default budget: 80% of the memory available at start, what this process already holds
/// included (the first model may be loaded by then).
pub fn default_budget() -> u64 {
    let available = available_memory().unwrap_or(8 << 30);
    (available + process_rss()) / 5 * 4
}

/// Resident bytes of this process.
pub fn process_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status").ok().and_then(|s| meminfo_field(&s, "VmRSS:")).unwrap_or(0)
}

/// A `Name:   123 kB` line's value in bytes.
fn meminfo_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line[name.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_decimal_and_binary_units() {
        assert_eq!(parse_bytes("700MB"), Ok(700_000_000));
        assert_eq!(parse_bytes("4GiB"), Ok(4 << 30));
        assert_eq!(parse_bytes("123456"), Ok(123_456));
        assert_eq!(parse_bytes(" 2 MiB "), Ok(2 << 20));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("0MB").is_err());
        assert!(parse_bytes("0").is_err());
        assert_eq!(parse_size("0"), Ok(0), "a size flag may be 0");
        assert_eq!(parse_size("256MiB"), Ok(256 * 1024 * 1024));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert!(parse_size("lots").is_err());
    }

    #[test]
    fn meminfo_lines_are_read_in_kilobytes() {
        let text = "MemTotal:       24684108 kB\nMemAvailable:   22153000 kB\n";
        assert_eq!(meminfo_field(text, "MemAvailable:"), Some(22_153_000 * 1024));
        assert_eq!(meminfo_field(text, "SwapTotal:"), None);
        assert!(available_memory().is_some_and(|b| b > 0), "this is Linux");
        assert!(process_rss() > 0);
        assert!(default_budget() > 0);
    }
}
