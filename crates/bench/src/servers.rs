//! Starting and stopping the two servers under test, one at a time.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// Settings both servers get.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub model: PathBuf,
    pub threads: u32,
    pub parallel: u32,
    /// Per sequence; llama-server gets `ctx_per_seq * parallel` in total.
    pub ctx_per_seq: u32,
    pub ready_timeout: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Gantry,
    Reference,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Gantry => "Gantry",
            Kind::Reference => "llama-server",
        }
    }
}

pub struct Running {
    pub kind: Kind,
    pub base_url: String,
    pub model_id: String,
    pub api_key: Option<String>,
    /// The command line, for the report.
    pub command: String,
    pub version: String,
    bin: PathBuf,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn quote(args: &[String]) -> String {
    args.iter()
        .map(|a| if a.contains(' ') || a.is_empty() { format!("'{a}'") } else { a.clone() })
        .collect::<Vec<_>>()
        .join(" ")
}

/// First line of `<bin> --version` (stdout or stderr), for the report.
pub async fn version_of(bin: &Path) -> String {
    match Command::new(bin).arg("--version").output().await {
        Ok(out) => {
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let line = text.lines().find(|l| l.contains("version")).or_else(|| text.lines().next());
            line.unwrap_or("unknown").trim().to_string()
        }
        Err(e) => format!("unknown ({e})"),
    }
}

pub async fn start(kind: Kind, bin: &Path, s: &ServerSettings) -> Result<Running> {
    let dir = tempfile::Builder::new().prefix("gantry-bench-").tempdir()?;
    let port = free_port()?;
    let log = dir.path().join("server.log");
    let model = s.model.display().to_string();
    let (args, api_key): (Vec<String>, Option<String>) = match kind {
        Kind::Gantry => {
            let key = format!("sk-gantry-bench-key-{port:05}");
            let a = [
                "serve", "--model", &model, "--port", &port.to_string(), "--host", "127.0.0.1", "--data-dir",
                &dir.path().join("data").display().to_string(), "--api-key", &key, "--parallel",
                &s.parallel.to_string(), "--ctx-size", &s.ctx_per_seq.to_string(), "--threads", &s.threads.to_string(),
            ];
            (a.iter().map(|x| x.to_string()).collect(), Some(key))
        }
        Kind::Reference => {
            let a = [
                "-m", &model, "--host", "127.0.0.1", "--port", &port.to_string(), "-t", &s.threads.to_string(),
                "-np", &s.parallel.to_string(), "-c", &(s.ctx_per_seq * s.parallel).to_string(), "--cont-batching",
            ];
            (a.iter().map(|x| x.to_string()).collect(), None)
        }
    };
    let mut shown = vec![bin.display().to_string()];
    shown.extend(args.iter().cloned());
    let command = quote(&shown);
    let version = version_of(bin).await;
    eprintln!("[bench] starting {}: {command}", kind.label());

    let log_file = std::fs::File::create(&log)?;
    let mut cmd = Command::new(bin);
    cmd.args(&args).stdin(Stdio::null()).stderr(log_file.try_clone()?).kill_on_drop(true);
    cmd.stdout(if kind == Kind::Gantry { Stdio::piped() } else { Stdio::from(log_file) });
    let mut child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
    let base_url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + s.ready_timeout;
    let fallback_id = s.model.file_stem().map(|x| x.to_string_lossy().into_owned()).unwrap_or_default();

    let model_id = match kind {
        Kind::Gantry => {
            let stdout = child.stdout.take().context("no stdout")?;
            let mut lines = BufReader::new(stdout).lines();
            let mut id = None;
            while id.is_none() {
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, lines.next_line()).await {
                    Err(_) => bail!("Gantry not ready after {:?}; log {}:\n{}", s.ready_timeout, log.display(), tail(&log)),
                    Ok(Ok(None)) | Ok(Err(_)) => bail!("Gantry exited before serving; log:\n{}", tail(&log)),
                    Ok(Ok(Some(line))) => id = parse_banner(&line),
                }
            }
            // Keep draining stdout into the log so the pipe never fills.
            let log2 = log.clone();
            tokio::spawn(async move {
                let mut f = tokio::fs::OpenOptions::new().append(true).open(log2).await.ok();
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(f) = f.as_mut() {
                        let _ = f.write_all(format!("{line}\n").as_bytes()).await;
                    }
                }
            });
            id.unwrap()
        }
        Kind::Reference => {
            let client = reqwest::Client::new();
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    bail!("llama-server exited ({status}); log:\n{}", tail(&log));
                }
                let ok = client.get(format!("{base_url}/health")).send().await.map(|r| r.status().is_success());
                if let Ok(true) = ok {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("llama-server not healthy after {:?}; log:\n{}", s.ready_timeout, tail(&log));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            fallback_id
        }
    };
    Ok(Running { kind, base_url, model_id, api_key, command, version, bin: bin.to_path_buf(), child, log, _dir: dir })
}

/// `Gantry is serving `ID` at http://…/v1` → `ID`.
pub fn parse_banner(line: &str) -> Option<String> {
    let rest = line.split("Gantry is serving `").nth(1)?;
    Some(rest.split('`').next()?.to_string())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

impl Running {
    /// SIGTERM, then SIGKILL after a grace period; waits for the exit.
    pub async fn stop(mut self) -> Result<()> {
        if let Some(pid) = self.child.id() {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        }
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait()).await.is_err() {
            eprintln!("[bench] {} ignored SIGTERM; killing (log {})", self.kind.label(), self.log.display());
            self.child.kill().await?;
        }
        Ok(())
    }

    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }

    /// The CPU features the server's ggml was built with: Gantry's `gantry_cpu_backend_info`
    /// gauge, llama-server's `system_info` log line. `None` when neither says.
    pub async fn cpu_features(&self) -> Option<String> {
        match self.kind {
            Kind::Gantry => {
                let metrics = reqwest::get(format!("{}/metrics", self.base_url)).await.ok()?.text().await.ok()?;
                gantry_features(&metrics)
            }
            // This llama-server does not log them at its default verbosity; its build script wrote
            // the compiler's view of the same flags next to it.
            Kind::Reference => llama_server_features(&std::fs::read_to_string(&self.log).unwrap_or_default())
                .or_else(|| build_info_features(&std::fs::read_to_string(self.bin.with_file_name("BUILD_INFO")).ok()?)),
        }
    }
}

/// `gantry_cpu_backend_info{features="SSE3 AVX AVX2"} 1` → `SSE3 AVX AVX2`.
pub fn gantry_features(metrics: &str) -> Option<String> {
    let line = metrics.lines().find(|l| l.starts_with("gantry_cpu_backend_info{"))?;
    let rest = line.split_once("features=\"")?.1;
    Some(rest.split_once('"')?.0.to_string())
}

/// BUILD_INFO's `cpu features: AVX AVX2 …` line (scripts/build-reference-llama-server.sh).
pub fn build_info_features(info: &str) -> Option<String> {
    let features = info.lines().find_map(|l| l.strip_prefix("cpu features:"))?.trim();
    (!features.is_empty()).then(|| format!("{features} (from BUILD_INFO)"))
}

/// `system_info: n_threads = 2 … | CPU : SSE3 = 1 | AVX = 1 | AVX512 = 0 | … |` → `SSE3 AVX …`
/// (the features that are on).
pub fn llama_server_features(log: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains("CPU : "))?;
    let cpu = line.split_once("CPU : ")?.1;
    let on: Vec<&str> = cpu
        .split('|')
        .filter_map(|item| item.split_once('='))
        .map(|(name, value)| (name.trim(), value.trim()))
        .take_while(|(name, _)| !name.contains(" : "))
        .filter(|(_, value)| !value.is_empty() && *value != "0")
        .map(|(name, _)| name)
        .collect();
    (!on.is_empty()).then(|| on.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banner_gives_model_id() {
        let l = "Gantry is serving `qwen2.5-coder-0.5b-instruct-q4_k_m` at http://127.0.0.1:8080/v1";
        assert_eq!(parse_banner(l).as_deref(), Some("qwen2.5-coder-0.5b-instruct-q4_k_m"));
        assert_eq!(parse_banner("loading model"), None);
    }

    #[test]
    fn cpu_features_from_both_servers() {
        let metrics = "# TYPE gantry_cpu_backend_info gauge\ngantry_cpu_backend_info{features=\"SSE3 AVX AVX2 FMA\"} 1\n";
        assert_eq!(gantry_features(metrics).as_deref(), Some("SSE3 AVX AVX2 FMA"));
        assert_eq!(gantry_features("gantry_queue_depth 0\n"), None);
        let log = "main: loading\nsystem_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | AVX = 1 | \
                   AVX512 = 0 | AVX512_VNNI = 1 | OPENMP = 1 | \nmain: ready";
        assert_eq!(llama_server_features(log).as_deref(), Some("SSE3 AVX AVX512_VNNI OPENMP"));
        assert_eq!(llama_server_features("nothing here"), None);
        let info = "llama.cpp build: b11434\ncpu features: AVX AVX2 FMA\nbuilt: x\n";
        assert_eq!(build_info_features(info).as_deref(), Some("AVX AVX2 FMA (from BUILD_INFO)"));
        assert_eq!(build_info_features("cpu features: \n"), None);
    }
}
