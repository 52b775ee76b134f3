//! The command line's defaults for each mode.

use super::*;

fn parse(args: &[&str]) -> Cli {
    Cli::try_parse_from([&["gantry-bench", "--model", "m.gguf"], args].concat()).unwrap()
}

#[test]
fn gpu_flag_picks_the_gpu_levels_requests_and_report() {
    let gpu = parse(&["--gpu"]);
    assert_eq!(gpu.mode(), Mode::Gpu);
    assert_eq!(gpu.concurrency(), vec![1, 4, 8, 16, 32, 64]);
    assert_eq!(gpu.requests(), 64);
    assert_eq!(gpu.outputs(), (PathBuf::from("docs/benchmarks-gpu.md"), PathBuf::from("docs/bench-chart-gpu.svg")));
    let cpu = parse(&[]);
    assert_eq!(cpu.mode(), Mode::Cpu);
    assert_eq!(cpu.concurrency(), vec![1, 4, 8, 16]);
    assert_eq!(cpu.requests(), 16);
    assert_eq!(cpu.outputs().0, PathBuf::from("docs/benchmarks.md"));
}

#[test]
fn given_flags_win_over_the_modes_defaults() {
    let c =
        parse(&["--gpu", "--concurrency", "1,32", "--requests", "8", "--out", "/tmp/r.md", "--chart", "/tmp/c.svg"]);
    assert_eq!(c.concurrency(), vec![1, 32]);
    assert_eq!(c.requests(), 8);
    assert_eq!(c.outputs(), (PathBuf::from("/tmp/r.md"), PathBuf::from("/tmp/c.svg")));
    assert!(Cli::try_parse_from(["gantry-bench", "--model", "m", "--gpu", "--requests", "x"]).is_err());
}

#[test]
fn the_tuned_reference_runs_unless_turned_off() {
    assert_eq!(parse(&[]).servers(), ["gantry", "reference", "reference-tuned"]);
    assert_eq!(parse(&["--no-tuned-reference"]).servers(), ["gantry", "reference"]);
    assert_eq!(parse(&["--servers", "gantry,tuned", "--no-tuned-reference"]).servers(), ["gantry"]);
    assert_eq!(parse(&["--servers", "reference-tuned,gantry"]).servers(), ["reference-tuned", "gantry"]);
}

#[test]
fn the_sharing_measurement_runs_a_minute_unless_given_seconds_or_0() {
    assert_eq!(parse(&[]).sharing_seconds, 60);
    assert_eq!(parse(&["--sharing-seconds", "0"]).sharing_seconds, 0);
    assert!(Cli::try_parse_from(["gantry-bench", "--model", "m", "--sharing-seconds", "-1"]).is_err());
}
