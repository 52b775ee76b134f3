//! Weighted sharing between tenants (issue #56), Gantry only (llama-server has no tenants): two
//! tenants weighing 3:1 that both flood the server must run sequences 3:1, within 10%, over a
//! minute, however many keys each holds.
//!
//! Tenant H (weight 3) sends with one key, tenant L (weight 1) with ten: shared per key, L would
//! get ten shares to H's one; shared per tenant, as it should be, one to H's three. Each tenant
//! keeps twice the server's sequences in flight (closed loop), so both always have requests
//! waiting, and every request holds its sequence for as many tokens as any other (one prompt,
//! `max_tokens` with `ignore_eos`). The engine shares by tokens (deficit round robin,
//! docs/keys-and-billing.md "Weights"), so the share is counted two ways inside a window that
//! leaves the warm-up out: the completion tokens streamed in it, and the sequence-time (each
//! request's first token to its end, clipped to the window). Both are continuous, so the window's
//! edges cut no request's count whole; what stays coarse is the engine's own sharing, a whole
//! request at a time (and, for sequences freed in one step, all to the tenant furthest behind):
//! the section says how many requests each tenant ran, which is the measure's resolution. Tokens
//! are the engine's own currency; sequence-time also weighs each wave of one tenant's requests by
//! how fast the host ran it, so on a host whose speed varies it strays where tokens do not.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::load::{stream_request, Target};
use crate::servers::Running;
use crate::workloads::Request;

const HEAVY_WEIGHT: u32 = 3;
const LIGHT_WEIGHT: u32 = 1;
/// H's share over L's the weights ask for.
const TARGET_RATIO: f64 = HEAVY_WEIGHT as f64 / LIGHT_WEIGHT as f64;
/// How far the measured ratio may be from `TARGET_RATIO`, as a fraction of it.
const TOLERANCE: f64 = 0.10;
/// L's keys: together they get L's one weight, not ten.
const LIGHT_KEYS: usize = 10;
/// Completion tokens of every request.
const MAX_TOKENS: u32 = 32;
/// Left out at the start: with nothing served yet the tenants take turns, one sequence each.
const WARMUP_S: f64 = 5.0;
/// Every request's prompt: after its first read the prefix cache serves it, so a request costs
/// its tokens and hardly any prompt rows, alike for both tenants.
const PROMPT: &str = "Count from 1 to 500, one number per line.";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tenant {
    Heavy,
    Light,
}

impl Tenant {
    fn name(self) -> &'static str {
        match self {
            Tenant::Heavy => "bench-share-heavy",
            Tenant::Light => "bench-share-light",
        }
    }
}

/// One request that ran to its end; times are seconds since the flood began.
#[derive(Clone, Debug)]
struct Finished {
    tenant: Tenant,
    /// When each streamed content delta arrived (the first is the first token).
    delta_times: Vec<f64>,
    end: f64,
    completion_tokens: u64,
}

impl Finished {
    /// Its completion tokens streamed inside `window`: by its deltas' arrival, each worth an
    /// even part of the tokens usage counts (a delta is a token unless it held a split character).
    fn tokens_in(&self, window: Window) -> f64 {
        let inside = self.delta_times.iter().filter(|&&t| window.holds(t)).count();
        self.completion_tokens as f64 * inside as f64 / self.delta_times.len().max(1) as f64
    }
}

/// The part of the flood that is counted, `[start, end)` in seconds since it began.
#[derive(Clone, Copy, Debug)]
struct Window {
    start: f64,
    end: f64,
}

impl Window {
    fn holds(&self, t: f64) -> bool {
        t >= self.start && t < self.end
    }

    /// Seconds of `[from, to]` inside the window.
    fn overlap(&self, from: f64, to: f64) -> f64 {
        (to.min(self.end) - from.max(self.start)).max(0.0)
    }
}

/// What one tenant got inside the window.
#[derive(Clone, Debug, Default, PartialEq)]
struct Share {
    /// Requests that ran inside the window, for the measure's resolution: the engine shares
    /// sequences a whole request at a time.
    requests: usize,
    /// Completion tokens streamed inside the window.
    tokens: f64,
    /// Σ over every request of its first token to its end, clipped to the window.
    sequence_s: f64,
}

/// H's and L's shares, in that order.
fn shares(done: &[Finished], window: Window) -> [Share; 2] {
    let mut out = [Share::default(), Share::default()];
    for f in done {
        let share = &mut out[if f.tenant == Tenant::Heavy { 0 } else { 1 }];
        let Some(&first_token) = f.delta_times.first() else { continue };
        let sequence_s = window.overlap(first_token, f.end);
        share.requests += usize::from(sequence_s > 0.0);
        share.tokens += f.tokens_in(window);
        share.sequence_s += sequence_s;
    }
    out
}

/// `heavy / light`; `None` when L got nothing, which no ratio describes.
fn ratio(heavy: f64, light: f64) -> Option<f64> {
    (light > 0.0).then(|| heavy / light)
}

/// Whether a ratio is within `TOLERANCE` of `TARGET_RATIO`.
fn within_target(ratio: Option<f64>) -> bool {
    ratio.is_some_and(|r| (TARGET_RATIO * (1.0 - TOLERANCE)..=TARGET_RATIO * (1.0 + TOLERANCE)).contains(&r))
}

/// Sets the tenants up on a Gantry server started for this, floods it for `seconds` after the
/// warm-up, and returns the section.
pub(crate) async fn measure(server: &Running, parallel: usize, seconds: u64) -> Result<String> {
    let client = reqwest::Client::new();
    let admin = Admin {
        client: client.clone(),
        base_url: server.base_url.clone(),
        token: server.admin_token.clone().context("Gantry runs with an admin token")?,
    };
    let heavy_keys = admin.tenant(Tenant::Heavy, HEAVY_WEIGHT, 1).await?;
    let light_keys = admin.tenant(Tenant::Light, LIGHT_WEIGHT, LIGHT_KEYS).await?;
    let window = Window { start: WARMUP_S, end: WARMUP_S + seconds as f64 };
    let in_flight = 2 * parallel;
    let began = Instant::now();
    // Dropped on an early return, which stops every request still in flight.
    let mut workers = JoinSet::new();
    for (tenant, keys) in [(Tenant::Heavy, heavy_keys), (Tenant::Light, light_keys)] {
        let target = Target {
            client: client.clone(),
            base_url: server.base_url.clone(),
            api_keys: keys,
            model: server.model_id.clone(),
            completions: false,
        };
        // Shared by the tenant's workers, so its requests go to its keys in turn.
        let next_key = Arc::new(AtomicUsize::new(0));
        for _ in 0..in_flight {
            workers.spawn(flood(target.clone(), tenant, next_key.clone(), began, window.end));
        }
    }
    let mut done = Vec::new();
    while let Some(worker) = workers.join_next().await {
        done.extend(worker??);
    }
    Ok(section(&shares(&done, window), parallel, in_flight, seconds))
}

/// One closed-loop client of `tenant`: sends a request as soon as its last one ended, until
/// `until` seconds after `began`. The requests still running then finish, and count as far as
/// they fall inside the window.
async fn flood(
    target: Target,
    tenant: Tenant,
    next_key: Arc<AtomicUsize>,
    began: Instant,
    until: f64,
) -> Result<Vec<Finished>> {
    let mut done = Vec::new();
    while began.elapsed().as_secs_f64() < until {
        let messages = json!([{"role": "user", "content": PROMPT}]);
        let key_slot = next_key.fetch_add(1, Ordering::Relaxed);
        let request = Request { key_slot, ignore_eos: true, ..Request::greedy(messages) };
        let sent = began.elapsed().as_secs_f64();
        let sample = stream_request(&target, request, MAX_TOKENS).await;
        let end = began.elapsed().as_secs_f64();
        if let Some(e) = sample.error {
            bail!("a request of tenant {} failed: {e}", tenant.name());
        }
        let first_token = sent + sample.ttft.context("a request streamed no token")?;
        let delta_times = std::iter::once(first_token)
            .chain(sample.itl.iter().scan(first_token, |t, gap| {
                *t += gap;
                Some(*t)
            }))
            .collect();
        done.push(Finished { tenant, delta_times, end, completion_tokens: sample.completion_tokens });
    }
    Ok(done)
}

/// The admin API of the Gantry under test.
struct Admin {
    client: reqwest::Client,
    base_url: String,
    token: String,
}

impl Admin {
    /// Gives `tenant` its weight and `keys` new keys, and returns their secrets. The keys get no
    /// RPM or TPM limit, and the server none by default: only the weights limit the tenants.
    async fn tenant(&self, tenant: Tenant, weight: u32, keys: usize) -> Result<Vec<String>> {
        let name = tenant.name();
        let url = format!("{}/admin/v1/tenants/{name}", self.base_url);
        let shown = self.send(self.client.patch(url), json!({"weight": weight})).await?;
        if shown["weight"] != weight {
            bail!("tenant {name} weighs {} after setting {weight}", shown["weight"]);
        }
        let mut secrets = Vec::new();
        for i in 0..keys {
            let body = json!({"name": format!("{name}-{i}"), "tenant": name});
            let key = self.send(self.client.post(format!("{}/admin/v1/keys", self.base_url)), body).await?;
            secrets.push(key["secret"].as_str().context("a new key's secret")?.to_string());
        }
        Ok(secrets)
    }

    async fn send(&self, request: reqwest::RequestBuilder, body: Value) -> Result<Value> {
        let resp = request
            .bearer_auth(&self.token)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if !status.is_success() {
            bail!("admin API: HTTP {status}: {text}");
        }
        Ok(serde_json::from_str(&text)?)
    }
}

/// The markdown section, both measures judged against the target.
fn section(shares: &[Share; 2], parallel: usize, in_flight: usize, seconds: u64) -> String {
    let [heavy, light] = shares;
    let (lo, hi) = (TARGET_RATIO * (1.0 - TOLERANCE), TARGET_RATIO * (1.0 + TOLERANCE));
    let mut s = String::from("## Weighted sharing between tenants (Gantry only)\n\n");
    let _ = writeln!(
        s,
        "Tenant H (weight {HEAVY_WEIGHT}, one key) and tenant L (weight {LIGHT_WEIGHT}, {LIGHT_KEYS} keys in turn) \
         each keep {in_flight} streamed chat requests of {MAX_TOKENS} tokens (`ignore_eos`, one prompt) in flight \
         on {parallel} sequences, for {seconds} s after a {WARMUP_S:.0} s warm-up that is not counted. Per tenant, \
         inside that window: the completion tokens streamed in it, and the sequence-time (first token to end of \
         every request, clipped to the window). The target: H:L within {:.0}% of {TARGET_RATIO:.0}:1. The engine \
         shares tokens, handing out sequences a whole request at a time and those freed in the same step all to \
         the tenant furthest behind: with requests of one length the shares come in waves, so where each tenant \
         ran few requests the ratio swings with where the window cuts, and sequence-time also with how fast the \
         host ran each wave.\n",
        TOLERANCE * 100.0
    );
    let _ = writeln!(s, "| measure | H | L | H:L | target | |\n| --- | --- | --- | --- | --- | --- |");
    let mut row = |measure: &str, h: String, l: String, r: Option<f64>| {
        let shown = r.map(|r| format!("{r:.2}")).unwrap_or_else(|| "n/a".into());
        let verdict = if within_target(r) { "met" } else { "not met" };
        let _ = writeln!(s, "| {measure} | {h} | {l} | {shown} | {lo:.2}–{hi:.2} | {verdict} |");
    };
    row(
        "completion tokens",
        format!("{:.0} ({} requests)", heavy.tokens, heavy.requests),
        format!("{:.0} ({} requests)", light.tokens, light.requests),
        ratio(heavy.tokens, light.tokens),
    );
    let seconds = |share: &Share| format!("{:.1}", share.sequence_s);
    row("sequence-seconds", seconds(heavy), seconds(light), ratio(heavy.sequence_s, light.sequence_s));
    s
}

#[cfg(test)]
#[path = "sharing_tests.rs"]
mod tests;
