//! Starting and stopping the servers under test (their command lines are in `server_args.rs`).
#![allow(unsafe_code, reason = "kill(2) of the bench's own child server through libc")]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::runs::{GANTRY, REFERENCE, TUNED};
use crate::server_args::server_args;
use crate::step_profile::StepProfile;

/// Settings both servers get.
#[derive(Clone, Debug)]
pub(crate) struct ServerSettings {
    pub model: PathBuf,
    pub threads: u32,
    pub parallel: u32,
    /// Per sequence; llama-server gets `ctx_per_seq * parallel` in total.
    pub ctx_per_seq: u32,
    pub ready_timeout: Duration,
    /// GPU mode: both offload every layer. Gantry does by default in a CUDA build (its
    /// `--n-gpu-layers` left unset means all); llama-server needs `-ngl`, or it keeps the model
    /// on the CPU.
    pub gpu: bool,
    /// The model is an embedding model: llama-server is started with `--embeddings` and a
    /// batch that holds every slot's input (see `embeddings`).
    pub embeddings: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Gantry,
    /// llama-server as `make bench` has always started it.
    Reference,
    /// The same llama-server binary run as an expert would (`server_args::TUNED_REFERENCE_ARGS`).
    TunedReference,
}

impl Kind {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Kind::Gantry => GANTRY,
            Kind::Reference => REFERENCE,
            Kind::TunedReference => TUNED,
        }
    }
}

pub(crate) struct Running {
    pub kind: Kind,
    pub base_url: String,
    pub model_id: String,
    pub api_key: Option<String>,
    /// Gantry's admin token (`sharing` sets tenants' weights through the admin API).
    pub admin_token: Option<String>,
    /// The command line, for the report.
    pub command: String,
    pub version: String,
    bin: PathBuf,
    child: Child,
    log: PathBuf,
    dir: tempfile::TempDir,
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
pub(crate) async fn version_of(bin: &Path) -> String {
    match Command::new(bin).arg("--version").output().await {
        Ok(out) => {
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let line = text.lines().find(|l| l.contains("version")).or_else(|| text.lines().next());
            line.unwrap_or("unknown").trim().to_string()
        }
        Err(e) => format!("unknown ({e})"),
    }
}

pub(crate) async fn start(kind: Kind, bin: &Path, s: &ServerSettings) -> Result<Running> {
    let dir = tempfile::Builder::new().prefix("gantry-bench-").tempdir()?;
    let port = free_port()?;
    let log = dir.path().join("server.log");
    let model = s.model.display().to_string();
    let (args, api_key) = server_args(kind, &model, port, dir.path(), s);
    let mut shown = vec![bin.display().to_string()];
    shown.extend(args.iter().cloned());
    let command = quote(&shown);
    let version = version_of(bin).await;
    eprintln!("[bench] starting {}: {command}", kind.label());

    let log_file = std::fs::File::create(&log)?;
    let mut cmd = Command::new(bin);
    cmd.args(&args).stdin(Stdio::null()).stderr(log_file.try_clone()?).kill_on_drop(true);
    // Through the environment, not `--admin-token`, so the report's command line does not carry
    // it; a fresh random one each start, as Gantry refuses weak tokens.
    let admin_token = if kind == Kind::Gantry { Some(random_token()?) } else { None };
    if let Some(token) = &admin_token {
        cmd.env("GANTRY_ADMIN_TOKEN", token);
    }
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
                    Err(_) => {
                        bail!("Gantry not ready after {:?}; log {}:\n{}", s.ready_timeout, log.display(), tail(&log))
                    }
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
        Kind::Reference | Kind::TunedReference => {
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
    Ok(Running {
        kind,
        base_url,
        model_id,
        api_key,
        admin_token,
        command,
        version,
        bin: bin.to_path_buf(),
        child,
        log,
        dir,
    })
}

/// 32 bytes from the kernel's random source, as 64 hex characters.
fn random_token() -> Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes).context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `Gantry is serving `ID` at http://…/v1` → `ID`.
pub(crate) fn parse_banner(line: &str) -> Option<String> {
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
    pub(crate) async fn stop(mut self) -> Result<()> {
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

    /// Runs `<gantry> ARGS --data-dir <this server's data dir>` (e.g. `keys create`) and returns
    /// its stdout. Gantry only.
    pub(crate) async fn run_cli(&self, args: &[&str]) -> Result<String> {
        if self.kind != Kind::Gantry {
            bail!("{} has no Gantry CLI", self.kind.label());
        }
        let data_dir = self.dir.path().join("data");
        let out =
            Command::new(&self.bin).args(args).arg("--data-dir").arg(&data_dir).stdin(Stdio::null()).output().await?;
        if !out.status.success() {
            bail!("gantry {} failed ({}): {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Where the server put the model, as far as can be told: what it says itself (Gantry's
    /// `gantry_gpu_info` gauge, llama-server's `offloaded N/M layers to GPU` log line) and the GPU
    /// memory nvidia-smi counts for its process.
    pub(crate) async fn gpu_offload(&self) -> GpuOffload {
        let stated = match self.kind {
            Kind::Gantry => gantry_gpus(&self.metrics().await.unwrap_or_default()),
            Kind::Reference | Kind::TunedReference => {
                llama_server_offload(&std::fs::read_to_string(&self.log).unwrap_or_default())
            }
        };
        let smi = tokio::process::Command::new("nvidia-smi")
            .args(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
            .output()
            .await
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        let gpu_mib = self.child.id().and_then(|pid| gpu_memory_mib(smi.as_deref()?, pid));
        GpuOffload { stated, gpu_mib }
    }

    /// Gantry's step counters now (see `step_profile`); `None` for llama-server.
    pub(crate) async fn step_profile(&self) -> Option<StepProfile> {
        match self.kind {
            Kind::Gantry => StepProfile::parse(&self.metrics().await?),
            Kind::Reference | Kind::TunedReference => None,
        }
    }

    /// The server's `/metrics` text, `None` when it cannot be read.
    async fn metrics(&self) -> Option<String> {
        reqwest::get(format!("{}/metrics", self.base_url)).await.ok()?.text().await.ok()
    }

    pub(crate) fn log_tail(&self) -> String {
        tail(&self.log)
    }

    /// The CPU features the server's ggml was built with: Gantry's `gantry_cpu_backend_info`
    /// gauge, llama-server's `system_info` log line. `None` when neither says.
    pub(crate) async fn cpu_features(&self) -> Option<String> {
        match self.kind {
            Kind::Gantry => gantry_features(&self.metrics().await?),
            // This llama-server does not log them at its default verbosity; its build script wrote
            // the compiler's view of the same flags next to it.
            Kind::Reference | Kind::TunedReference => {
                llama_server_features(&std::fs::read_to_string(&self.log).unwrap_or_default()).or_else(|| {
                    build_info_features(&std::fs::read_to_string(self.bin.with_file_name("BUILD_INFO")).ok()?)
                })
            }
        }
    }
}

/// What a running server shows of its GPU offload.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GpuOffload {
    /// What the server says: Gantry's GPUs, llama-server's offloaded layer count.
    pub stated: Option<String>,
    /// Its process's GPU memory per nvidia-smi (where nvidia-smi lists processes).
    pub gpu_mib: Option<u64>,
}

impl GpuOffload {
    /// Whether every layer went to a GPU. By the server's own word where it gives one: Gantry
    /// names a GPU only when it offloads (every layer, as the bench leaves `--n-gpu-layers`
    /// unset); llama-server counts the layers. Where its log is silent (its default verbosity
    /// may hide llama.cpp's lines), by nvidia-smi: a process holding at least the model file's
    /// size in GPU memory holds the weights there.
    pub(crate) fn complete(&self, model_bytes: u64) -> bool {
        match self.stated.as_deref() {
            Some(s) => !s.contains("NOT ALL"),
            None => self.gpu_mib.is_some_and(|mib| mib * 1024 * 1024 >= model_bytes && model_bytes > 0),
        }
    }

    pub(crate) fn describe(&self) -> String {
        let parts: Vec<String> =
            [self.stated.clone(), self.gpu_mib.map(|m| format!("{m} MiB on the GPU per nvidia-smi"))]
                .into_iter()
                .flatten()
                .collect();
        if parts.is_empty() {
            "no GPU stated by the server nor seen by nvidia-smi".into()
        } else {
            parts.join("; ")
        }
    }
}

/// `gantry_gpu_info{device="CUDA0",name="NVIDIA H100 80GB HBM3"} 1` → `NVIDIA H100 80GB HBM3
/// (CUDA0)`, every GPU joined by `, `; `None` without one (a CPU build, or no usable driver).
pub(crate) fn gantry_gpus(metrics: &str) -> Option<String> {
    let label = |line: &str, name: &str| -> Option<String> {
        let rest = line.split_once(&format!("{name}=\""))?.1;
        Some(rest.split_once('"')?.0.to_string())
    };
    let gpus: Vec<String> = metrics
        .lines()
        .filter(|l| l.starts_with("gantry_gpu_info{"))
        .map(|l| match (label(l, "name"), label(l, "device")) {
            (Some(name), Some(device)) => format!("{name} ({device})"),
            (name, device) => name.or(device).unwrap_or_else(|| "unnamed GPU".into()),
        })
        .collect();
    (!gpus.is_empty()).then(|| gpus.join(", "))
}

/// llama.cpp's `load_tensors: offloaded 25/25 layers to GPU` → `offloaded 25/25 layers to GPU`,
/// with ` (NOT ALL)` added when fewer than all went.
pub(crate) fn llama_server_offload(log: &str) -> Option<String> {
    let line = log.lines().find(|l| l.contains("layers to GPU") && l.contains("offloaded "))?;
    let text = line[line.find("offloaded ")?..].trim().to_string();
    let counts = text.strip_prefix("offloaded ")?.split_whitespace().next()?;
    let (done, all) = counts.split_once('/')?;
    let all_went = matches!((done.parse::<u32>(), all.parse::<u32>()), (Ok(d), Ok(a)) if d == a);
    Some(if all_went { text } else { format!("{text} (NOT ALL)") })
}

/// The GPU memory (MiB) of process `pid` in `nvidia-smi --query-compute-apps=pid,used_memory
/// --format=csv,noheader,nounits`.
pub(crate) fn gpu_memory_mib(csv: &str, pid: u32) -> Option<u64> {
    csv.lines().find_map(|l| {
        let (p, mib) = l.split_once(',')?;
        (p.trim().parse::<u32>().ok()? == pid).then(|| mib.trim().parse().ok()).flatten()
    })
}

/// `gantry_cpu_backend_info{features="SSE3 AVX AVX2"} 1` → `SSE3 AVX AVX2`.
pub(crate) fn gantry_features(metrics: &str) -> Option<String> {
    let line = metrics.lines().find(|l| l.starts_with("gantry_cpu_backend_info{"))?;
    let rest = line.split_once("features=\"")?.1;
    Some(rest.split_once('"')?.0.to_string())
}

/// BUILD_INFO's `cpu features: AVX AVX2 …` line (scripts/build-reference-llama-server.sh).
pub(crate) fn build_info_features(info: &str) -> Option<String> {
    let features = info.lines().find_map(|l| l.strip_prefix("cpu features:"))?.trim();
    (!features.is_empty()).then(|| format!("{features} (from BUILD_INFO)"))
}

/// `system_info: n_threads = 2 … | CPU : SSE3 = 1 | AVX = 1 | AVX512 = 0 | … |` → `SSE3 AVX …`
/// (the features that are on).
pub(crate) fn llama_server_features(log: &str) -> Option<String> {
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
    fn admin_tokens_are_long_random_hex() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 64, "{a}");
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b, "a fresh token each start");
    }

    #[test]
    fn cpu_features_from_both_servers() {
        let metrics =
            "# TYPE gantry_cpu_backend_info gauge\ngantry_cpu_backend_info{features=\"SSE3 AVX AVX2 FMA\"} 1\n";
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

    #[test]
    fn gpu_offload_from_both_servers_and_nvidia_smi() {
        let metrics =
            "# TYPE gantry_gpu_info gauge\ngantry_gpu_info{device=\"CUDA0\",name=\"NVIDIA H100 80GB HBM3\"} 1\n\
                       gantry_gpu_memory_total_bytes{device=\"CUDA0\"} 85000000000\n";
        assert_eq!(gantry_gpus(metrics).as_deref(), Some("NVIDIA H100 80GB HBM3 (CUDA0)"));
        assert_eq!(gantry_gpus("gantry_cpu_backend_info{features=\"AVX2\"} 1\n"), None, "a CPU build has no GPU");
        let log = "llama_model_load: ...\nload_tensors: offloading 24 repeating layers to GPU\n\
                   load_tensors: offloaded 25/25 layers to GPU\nmain: ready";
        assert_eq!(llama_server_offload(log).as_deref(), Some("offloaded 25/25 layers to GPU"));
        let partial = "load_tensors: offloaded 10/25 layers to GPU\n";
        assert_eq!(llama_server_offload(partial).as_deref(), Some("offloaded 10/25 layers to GPU (NOT ALL)"));
        assert_eq!(llama_server_offload("load_tensors: CPU_Mapped model buffer size = 400 MiB\n"), None);
        let smi = "4242, 1830\n4343, 2210\n";
        assert_eq!(gpu_memory_mib(smi, 4343), Some(2210));
        assert_eq!(gpu_memory_mib(smi, 1), None);
        assert_eq!(gpu_memory_mib("", 4242), None);
        let model = 491_400_064; // 468.6 MiB
        let both = GpuOffload { stated: llama_server_offload(log), gpu_mib: Some(1830) };
        assert!(both.complete(model));
        assert_eq!(both.describe(), "offloaded 25/25 layers to GPU; 1830 MiB on the GPU per nvidia-smi");
        assert!(!GpuOffload { stated: llama_server_offload(partial), gpu_mib: Some(900) }.complete(model));
        assert!(
            GpuOffload { stated: None, gpu_mib: Some(900) }.complete(model),
            "a silent log, the weights' size on the GPU"
        );
        assert!(
            !GpuOffload { stated: None, gpu_mib: Some(300) }.complete(model),
            "less than the weights: not all on the GPU"
        );
        assert!(!GpuOffload { stated: None, gpu_mib: None }.complete(model));
        assert_eq!(GpuOffload::default().describe(), "no GPU stated by the server nor seen by nvidia-smi");
    }
}
