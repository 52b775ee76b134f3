//! docs/bench-chart.svg (and the GPU report's chart): tokens/s and TTFT p50 against concurrency.

use std::fmt::Write as _;

use crate::runs::{cells, find, ServerRun, GANTRY, REFERENCE, TUNED};
use crate::stats::LevelResult;

const COLORS: [(&str, &str); 3] = [(GANTRY, "#1f77b4"), (REFERENCE, "#ff7f0e"), (TUNED, "#d62728")];

/// Round up to 1, 2, 2.5 or 5 × 10^k.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|c| *c >= v * 1.05).unwrap_or(10.0 * mag)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Two panels (tokens/s and TTFT p50 against concurrency) for `workload`, one line per server.
pub(crate) fn svg(runs: &[ServerRun], workload: &str) -> String {
    let levels: Vec<usize> = {
        let mut c: Vec<usize> = cells(runs).into_iter().filter(|k| k.0 == workload).map(|k| k.1).collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let (pw, ph, top, left) = (380.0, 240.0, 50.0, 60.0);
    let (width, height) = (2.0 * (pw + left) + 70.0, top + ph + 80.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    type Metric = fn(&LevelResult) -> Option<f64>;
    let metrics: [(&str, Metric); 2] = [
        ("Completion tokens/s (higher is better)", |l| Some(l.tokens_per_s)),
        ("TTFT p50, ms (lower is better)", |l| l.ttft_p50_ms),
    ];
    for (p, (title, metric)) in metrics.iter().enumerate() {
        let x0 = left + p as f64 * (pw + left + 40.0);
        let series: Vec<(&str, Vec<(usize, f64)>)> = runs
            .iter()
            .map(|r| {
                let pts = levels
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| {
                        find(runs, &r.name, &(workload.to_string(), *c)).as_ref().and_then(metric).map(|v| (i, v))
                    })
                    .collect();
                (r.name.as_str(), pts)
            })
            .collect();
        let ymax = nice_max(series.iter().flat_map(|(_, p)| p.iter().map(|x| x.1)).fold(0.0, f64::max));
        let pad = 24.0;
        let xpos = |i: usize| {
            x0 + if levels.len() > 1 { pad + (pw - 2.0 * pad) * i as f64 / (levels.len() - 1) as f64 } else { pw / 2.0 }
        };
        let ypos = |v: f64| top + ph - ph * v / ymax;
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
            x0 + pw / 2.0,
            top - 20.0,
            esc(title)
        );
        for t in 0..=5 {
            let v = ymax * t as f64 / 5.0;
            let y = ypos(v);
            let _ = writeln!(s, r##"<line x1="{x0}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/>"##, x0 + pw);
            let label = if ymax >= 10.0 { format!("{v:.0}") } else { format!("{v:.1}") };
            let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="end">{label}</text>"#, x0 - 6.0, y + 4.0);
        }
        for (i, c) in levels.iter().enumerate() {
            let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">{c}</text>"#, xpos(i), top + ph + 18.0);
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">concurrent requests</text>"#,
            x0 + pw / 2.0,
            top + ph + 38.0
        );
        let _ = writeln!(s, r##"<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>"##);
        for (name, pts) in &series {
            let color = COLORS.iter().find(|c| c.0 == *name).map(|c| c.1).unwrap_or("#2ca02c");
            let path: Vec<String> = pts.iter().map(|(i, v)| format!("{:.1},{:.1}", xpos(*i), ypos(*v))).collect();
            let _ =
                writeln!(s, r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#, path.join(" "));
            for (i, v) in pts {
                let _ = writeln!(s, r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{color}"/>"#, xpos(*i), ypos(*v));
            }
        }
    }
    for (k, r) in runs.iter().enumerate() {
        let color = COLORS.iter().find(|c| c.0 == r.name).map(|c| c.1).unwrap_or("#2ca02c");
        let x = left + k as f64 * 200.0;
        let y = height - 14.0;
        let _ = writeln!(s, r#"<rect x="{x}" y="{}" width="14" height="4" fill="{color}"/>"#, y - 6.0);
        let _ = writeln!(s, r#"<text x="{}" y="{y}">{}</text>"#, x + 20.0, esc(&r.name));
    }
    s += "</svg>\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_numbers() {
        assert_eq!(nice_max(87.0), 100.0);
        assert_eq!(nice_max(19.5), 25.0);
        assert_eq!(nice_max(0.0), 1.0);
    }
}
