//! Faults injected into one request's step, for tests only: they prove that a panic while one
//! request is sampled, planned for drafts, watched for a tool call or turned into text ends that
//! request alone.
//!
//! The hook exists in the engine's own tests and in builds with the `fault-injection` feature,
//! which a dev-dependency of `gantry-server` turns on: `cargo build --workspace --all-targets`
//! (`make test`) builds `target/debug/gantry` with it, `make build`'s release binary never has
//! it. Even there it is armed only by `GANTRY_FAULTS=prompt-markers` in the environment (the
//! server logs a warning at start when it is). Elsewhere a [`Fault`] holds nothing and
//! [`Fault::check`] does nothing.

/// The environment variable that arms the hook in a `fault-injection` build.
pub const FAULTS_ENV: &str = "GANTRY_FAULTS";
/// The one value of [`FAULTS_ENV`] that arms it: faults are read from prompts.
pub const FAULTS_ARMED: &str = "prompt-markers";

/// Where in one request's step a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultPoint {
    /// Starting the request on its sequences (`ActiveRequest::new`: its grammar's matchers).
    Starting,
    /// Sampling the next token (the sampler chain, a grammar included).
    Sampling,
    /// Planning the draft tokens to verify after the next one (`Scheduler::plan`).
    Drafting,
    /// Watching the output for a tool call to constrain (`tool_choice: "auto"`).
    Watching,
    /// Turning a token into text: UTF-8 assembly and stop strings.
    Producing,
}

/// A request's planned fault: none, except where the hook is armed and the prompt carries the
/// marker `gantry-fault:<starting|sampling|drafting|watching|producing>@<tokens>`, which panics at that
/// point once the request has produced `<tokens>` tokens.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fault {
    #[cfg(any(test, feature = "fault-injection"))]
    planned: Option<(FaultPoint, u32)>,
}

/// Whether faults are read from prompts in this process: always in the engine's tests; in a
/// `fault-injection` build, when `GANTRY_FAULTS=prompt-markers`; never otherwise.
pub fn fault_injection_armed() -> bool {
    cfg!(test) || armed_by_env()
}

/// Whether this build carries the hook at all (the `fault-injection` feature).
pub fn fault_injection_compiled() -> bool {
    cfg!(feature = "fault-injection")
}

#[cfg(feature = "fault-injection")]
fn armed_by_env() -> bool {
    static ARMED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ARMED.get_or_init(|| std::env::var(FAULTS_ENV).is_ok_and(|v| v == FAULTS_ARMED))
}

#[cfg(not(feature = "fault-injection"))]
fn armed_by_env() -> bool {
    false
}

impl Fault {
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) fn from_prompt(text: &str) -> Self {
        if !fault_injection_armed() {
            return Self::default();
        }
        let planned = text.split("gantry-fault:").nth(1).and_then(|rest| {
            let (point, after) = rest.split_once('@')?;
            let point = match point {
                "starting" => FaultPoint::Starting,
                "sampling" => FaultPoint::Sampling,
                "drafting" => FaultPoint::Drafting,
                "watching" => FaultPoint::Watching,
                "producing" => FaultPoint::Producing,
                _ => return None,
            };
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            Some((point, digits.parse().ok()?))
        });
        Self { planned }
    }

    #[cfg(not(any(test, feature = "fault-injection")))]
    pub(crate) fn from_prompt(_text: &str) -> Self {
        Self {}
    }

    /// Panics if this request planned a fault at `point` and has produced enough tokens.
    #[cfg(any(test, feature = "fault-injection"))]
    pub(crate) fn check(&self, point: FaultPoint, produced: u32) {
        if let Some((at, after)) = self.planned {
            if at == point && produced >= after {
                panic!("injected fault: {point:?} after {produced} tokens");
            }
        }
    }

    #[cfg(not(any(test, feature = "fault-injection")))]
    #[inline(always)]
    pub(crate) fn check(&self, _point: FaultPoint, _produced: u32) {}
}
