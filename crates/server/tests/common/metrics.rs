//! A Prometheus text page read as the inference gateway's endpoint picker reads it (its
//! `spec.go` matching), for the tests of the load gauges it routes by.

use std::time::{Duration, Instant};

/// One sample as the exposition format writes it: `name{labels} value`, labels as written.
#[derive(Debug)]
pub(crate) struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// The samples of a Prometheus text page, read as the picker's `spec.go` matches them: a family
/// by its exact name, labels `key="value"` pairs (escapes `\\`, `\"`, `\n`).
pub(crate) fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("no value: {line}"));
            let value = value.parse().unwrap_or_else(|_| panic!("not a number: {line}"));
            let (name, labels) = match series.split_once('{') {
                None => (series, Vec::new()),
                Some((name, rest)) => (name, labels(rest.strip_suffix('}').unwrap_or_else(|| panic!("{line}")))),
            };
            assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'), "{line}");
            Sample { name: name.to_string(), labels, value }
        })
        .collect()
}

fn labels(mut rest: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"").unwrap_or_else(|| panic!("bad labels: {rest}"));
        let (mut value, mut chars) = (String::new(), after.char_indices());
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("bad escape: {rest}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label: {rest}"),
            }
        };
        out.push((key.to_string(), value));
        rest = after[end + 1..].trim_start_matches(',');
    }
    out
}

/// The one sample of `family` (the test fails if there are more).
pub(crate) fn one<'a>(samples: &'a [Sample], family: &str) -> &'a Sample {
    let found: Vec<&Sample> = samples.iter().filter(|s| s.name == family).collect();
    assert_eq!(found.len(), 1, "{family}: {found:?}");
    found[0]
}

pub(crate) async fn scrape(url: &str) -> Vec<Sample> {
    let resp = reqwest::get(url).await.unwrap();
    assert_eq!(resp.status(), 200, "{url}");
    parse(&resp.text().await.unwrap())
}

/// Scrapes until `done` holds, for at most 30 s.
pub(crate) async fn scrape_until(url: &str, what: &str, done: impl Fn(&[Sample]) -> bool) -> Vec<Sample> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let samples = scrape(url).await;
        if done(&samples) {
            return samples;
        }
        assert!(Instant::now() < deadline, "{what} never showed: {samples:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
