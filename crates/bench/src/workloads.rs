//! What each workload sends: deterministic prompts (both servers get identical requests), the
//! `response_format` where one applies, and how many tokens to ask for.
//!
//! - `chat`: a ~`prompt_tokens` prompt asking for a story, distinct per request.
//! - `shared-prefix`: one long shared system prompt and a short distinct user turn; with one
//!   request per stream it is a cold burst (the prefix has not been computed when they arrive).
//! - `code-edit`: a 95–100 line source file and one small change (a rename, a new parameter);
//!   the answer is the whole file again, so most of it can be copied from the prompt.
//! - `prose`: open-ended writing, nothing in the prompt to copy.
//! - `extract`: a paragraph and a 9-key JSON schema (`response_format: json_schema`).
//! - `chat-sampled`, `chat-top-p`: `chat`'s prompts sampled at temperature 0.8 (and top_p 0.95).
//!   No seed, as most clients send none: Gantry computes a seeded request's prompt afresh (no
//!   prompt cache), so a seed would change what is measured.
//! - `cache-scopes` (Gantry only): one shared system prompt and short questions spread over the
//!   keys of 1 or 4 tenants whose `cache_scope` is `shared` or `tenant` (see `scopes.rs`).
//! - `traffic`: real conversations (`traffic.rs`): a first human turn, and its recorded answer's
//!   length as `max_tokens` with `ignore_eos`, so both servers write answers of the recorded
//!   lengths; closed loop at 1 and 8 streams, and open loop at Poisson arrival rates.
//!
//! Every other workload is greedy at `--temperature` (0 by default).
//!
//! The pass number is part of every seed, so a repeated pass never hits a cache filled by the
//! previous one (in particular the shared prefix is cold in every pass).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::scopes::Tenancy;
use crate::traffic::Conversation;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Chat,
    SharedPrefix,
    CodeEdit,
    Prose,
    Extract,
    ChatSampled,
    ChatTopP,
    CacheScopes,
    Traffic,
}

/// Temperature of the sampled workloads.
pub(crate) const SAMPLED_TEMPERATURE: f64 = 0.8;
/// top_p of `chat-top-p`.
pub(crate) const SAMPLED_TOP_P: f64 = 0.95;

impl Kind {
    pub(crate) const ALL: [Kind; 9] = [
        Kind::Chat,
        Kind::SharedPrefix,
        Kind::CodeEdit,
        Kind::Prose,
        Kind::Extract,
        Kind::ChatSampled,
        Kind::ChatTopP,
        Kind::CacheScopes,
        Kind::Traffic,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Chat => "chat",
            Kind::SharedPrefix => "shared-prefix",
            Kind::CodeEdit => "code-edit",
            Kind::Prose => "prose",
            Kind::Extract => "extract",
            Kind::ChatSampled => "chat-sampled",
            Kind::ChatTopP => "chat-top-p",
            Kind::CacheScopes => "cache-scopes",
            Kind::Traffic => "traffic",
        }
    }

    /// The sampled workloads' temperature and top_p; `None` for the greedy ones.
    pub(crate) fn sampling(self) -> Option<(f64, Option<f64>)> {
        match self {
            Kind::ChatSampled | Kind::CacheScopes => Some((SAMPLED_TEMPERATURE, None)),
            Kind::ChatTopP => Some((SAMPLED_TEMPERATURE, Some(SAMPLED_TOP_P))),
            _ => None,
        }
    }

    /// Measured on Gantry alone: llama-server has no API keys nor tenants.
    pub(crate) fn gantry_only(self) -> bool {
        self == Kind::CacheScopes
    }

    /// Measured in the first comparison only (the native builds): the workload describes a
    /// server under real load, and one comparison of it is what the time allows.
    pub(crate) fn first_pair_only(self) -> bool {
        self.gantry_only() || self == Kind::Traffic
    }

    pub(crate) fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Workload {
    pub kind: Kind,
    /// `chat` only: approximate prompt length in tokens.
    pub prompt_tokens: usize,
    /// `shared-prefix` only: approximate length of the shared system prompt.
    pub shared_prefix_tokens: usize,
    pub max_tokens: u32,
    pub seed: u64,
    pub temperature: f64,
    pub top_p: Option<f64>,
    /// `cache-scopes` only: the tenants the requests are spread over and their keys' scope.
    pub tenancy: Option<Tenancy>,
    /// `traffic` only: the sampled conversations and which of them this level sends.
    pub traffic: Option<TrafficLevel>,
}

/// One level of `traffic`: its slice of the sample, and its arrival rate when open-loop.
#[derive(Clone, Debug)]
pub(crate) struct TrafficLevel {
    pub conversations: Arc<Vec<Conversation>>,
    /// Where the level's requests start in the sample in pass 0...
    pub offset: usize,
    /// ...and how far each later pass moves them, so no level or pass repeats a prompt.
    pub pass_stride: usize,
    /// Poisson arrivals at this many requests/s; `None`: closed loop.
    pub rate: Option<f64>,
}

/// The results label of an open-loop `traffic` level.
pub(crate) fn open_loop_label(rate: f64) -> String {
    format!("traffic@{rate}/s")
}

/// One request's body parts, and which of the target's keys sends it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Request {
    pub messages: Value,
    pub response_format: Option<Value>,
    pub temperature: f64,
    pub top_p: Option<f64>,
    /// Index (modulo their number) into the target's keys.
    pub key_slot: usize,
    /// Generate `max_tokens` whatever the model says (`sharing`: every request the same length).
    pub ignore_eos: bool,
    /// This request's own `max_tokens` (`traffic`: its recorded answer's), over the workload's.
    pub max_tokens: Option<u32>,
}

impl Request {
    /// A greedy request with one user message, sent with the target's first key.
    pub(crate) fn greedy(messages: Value) -> Request {
        Request {
            messages,
            response_format: None,
            temperature: 0.0,
            top_p: None,
            key_slot: 0,
            ignore_eos: false,
            max_tokens: None,
        }
    }
}

const WORDS: &[&str] = &[
    "river", "mountain", "engine", "garden", "signal", "harbor", "lantern", "forest", "market", "bridge", "winter",
    "copper", "library", "orbit", "valley", "thunder", "pencil", "island", "castle", "meadow", "silver", "window",
    "compass", "desert", "anchor", "candle", "planet", "ribbon", "tunnel", "village", "kernel", "socket", "buffer",
    "thread", "cache", "module", "packet", "vector", "matrix", "tensor", "morning", "evening", "summer", "autumn",
    "spring", "ocean", "cloud", "stone", "glass", "paper", "music", "story", "travel", "letter", "friend", "teacher",
    "doctor", "farmer", "painter", "sailor", "quiet", "bright", "gentle", "ancient", "simple", "rapid", "careful",
    "golden", "hidden", "open", "build", "carry", "measure", "follow", "gather", "listen", "repair", "launch",
    "travel", "explain",
];

/// Deterministic splitmix64, so both servers get identical prompts.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    fn word(&mut self) -> &'static str {
        self.pick(WORDS)
    }
}

/// Roughly `tokens` tokens of sentences (one common English word is about one token; a sentence of
/// ~10 words adds a full stop).
pub(crate) fn filler(rng: &mut Rng, tokens: usize) -> String {
    let words = tokens * 10 / 11;
    let mut out = String::with_capacity(words * 8);
    let mut in_sentence = 0;
    for i in 0..words {
        let w = rng.word();
        if in_sentence == 0 {
            let mut c = w.chars();
            let first = c.next().unwrap().to_ascii_uppercase();
            out.push(first);
            out.push_str(c.as_str());
        } else {
            out.push_str(w);
        }
        in_sentence += 1;
        if in_sentence >= 8 + (rng.next() % 6) as usize || i + 1 == words {
            out.push_str(". ");
            in_sentence = 0;
        } else {
            out.push(' ');
        }
    }
    out.trim_end().to_string()
}

/// The source files of `code-edit`, with changes a reviewer might ask for.
struct SourceFile {
    name: &'static str,
    language: &'static str,
    text: &'static str,
    edits: [&'static str; 4],
}

const SOURCES: [SourceFile; 2] = [
    SourceFile {
        name: "inventory.py",
        language: "python",
        text: include_str!("../assets/inventory.py"),
        edits: [
            "Rename the method `low_stock` to `items_below`.",
            "Add a parameter `limit: Optional[int] = None` to `Inventory.low_stock`; when it is given, return at most that many items.",
            "Rename the class `Move` to `StockMove` everywhere it is used.",
            "Add a parameter `width: int = 12` to `format_report` and use it instead of the fixed column width 12.",
        ],
    },
    SourceFile {
        name: "rate_limiter.rs",
        language: "rust",
        text: include_str!("../assets/rate_limiter.rs"),
        edits: [
            "Rename the method `prune` to `drop_full_buckets`.",
            "Rename the struct `Bucket` to `TokenBucket` everywhere it is used.",
            "Add a parameter `max_clients: usize` to `Limiter::refusals` that truncates the returned list to at most that many entries.",
            "Add a parameter `burst: f64` to `Bucket::new` and start the bucket with `burst` tokens instead of `capacity`.",
        ],
    },
];

const FIRST_NAMES: &[&str] =
    &["Maria", "James", "Aiko", "Tomasz", "Fatima", "Lucas", "Ingrid", "Kwame", "Priya", "Diego"];
const LAST_NAMES: &[&str] =
    &["Okafor", "Lindqvist", "Tanaka", "Novak", "Haddad", "Moreau", "Silva", "Brennan", "Iyer", "Kowalski"];
const CITIES: &[&str] =
    &["Lisbon", "Osaka", "Toronto", "Krakow", "Nairobi", "Valparaiso", "Bergen", "Pune", "Dublin", "Tucson"];
const PRODUCTS: &[&str] = &[
    "walnut desk lamp",
    "stainless kettle",
    "wool travel blanket",
    "cast-iron skillet",
    "noise-cancelling headset",
    "folding bicycle",
    "ceramic planter",
    "mechanical keyboard",
    "hiking backpack",
    "espresso grinder",
];

/// The `extract` schema: 9 keys of four JSON types, all required.
pub(crate) fn extract_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "customer_name": {"type": "string"},
            "age": {"type": "integer"},
            "city": {"type": "string"},
            "email": {"type": "string"},
            "order_id": {"type": "string"},
            "product": {"type": "string"},
            "quantity": {"type": "integer"},
            "unit_price": {"type": "number"},
            "express_shipping": {"type": "boolean"}
        },
        "required": ["customer_name", "age", "city", "email", "order_id", "product", "quantity", "unit_price",
                     "express_shipping"],
        "additionalProperties": false
    })
}

impl Workload {
    /// The name its results go under: the kind's, and for `cache-scopes` the tenancy's.
    pub(crate) fn label(&self) -> String {
        match (&self.tenancy, &self.traffic) {
            (Some(t), _) if self.kind == Kind::CacheScopes => t.label(),
            (_, Some(TrafficLevel { rate: Some(rate), .. })) if self.kind == Kind::Traffic => open_loop_label(*rate),
            _ => self.kind.name().to_string(),
        }
    }

    /// Request `i` of a level at `concurrency` in pass `pass`.
    pub(crate) fn request(&self, pass: usize, concurrency: usize, i: usize) -> Request {
        if let Some(t) = self.traffic.as_ref().filter(|_| self.kind == Kind::Traffic) {
            let c = &t.conversations[(t.offset + pass * t.pass_stride + i) % t.conversations.len().max(1)];
            return Request {
                temperature: self.temperature,
                ignore_eos: true,
                max_tokens: Some(c.max_tokens),
                ..Request::greedy(json!([{"role": "user", "content": c.prompt}]))
            };
        }
        let pass_seed = self.seed ^ ((pass as u64) << 48);
        let mut rng = Rng::new(pass_seed ^ ((concurrency as u64) << 32) ^ i as u64);
        let user = |text: String| json!([{"role": "user", "content": text}]);
        let mut key_slot = 0;
        let (messages, response_format) = match self.kind {
            Kind::Chat | Kind::ChatSampled | Kind::ChatTopP => {
                let lead = format!("{} {} {}", rng.word(), rng.word(), rng.word());
                let text = format!(
                    "[{lead} #{i}] Write a long, detailed story that uses all of these words: {}",
                    filler(&mut rng, self.prompt_tokens.saturating_sub(24))
                );
                (user(text), None)
            }
            Kind::SharedPrefix => {
                let mut shared = Rng::new(pass_seed);
                let system = format!(
                    "You are a writing assistant. Use the following reference notes when answering.\n\n{}",
                    filler(&mut shared, self.shared_prefix_tokens)
                );
                let question = format!(
                    "Question {i} (run {concurrency}): write a long, detailed paragraph about the {} and the {} near the {}.",
                    rng.word(),
                    rng.word(),
                    rng.word()
                );
                (json!([{"role": "system", "content": system}, {"role": "user", "content": question}]), None)
            }
            Kind::CacheScopes => {
                // One system prompt per tenancy and pass: no combination finds another's prefix.
                let tenancy = self.tenancy.unwrap_or_default();
                key_slot = i % tenancy.tenants.max(1);
                let mut shared = Rng::new(pass_seed ^ tenancy.seed_bits());
                let system = format!(
                    "You are the support assistant of a travel company. Answer briefly, using these notes.\n\n{}",
                    filler(&mut shared, self.shared_prefix_tokens)
                );
                let question = format!("Question {i}: what is a {} {}?", rng.word(), rng.word());
                (json!([{"role": "system", "content": system}, {"role": "user", "content": question}]), None)
            }
            // Without its sample (`traffic.rs` found no dataset) the workload is left out of the
            // plan; this only keeps the match whole.
            Kind::Traffic => (user("Hello.".into()), None),
            Kind::CodeEdit => {
                let file = &SOURCES[i % SOURCES.len()];
                let edit = file.edits[(i / SOURCES.len() + pass) % file.edits.len()];
                let text = format!(
                    "Here is `{}`:\n\n```{}\n{}```\n\n{edit} Change nothing else. Reply with the complete updated file in \
                     one code block and nothing else.",
                    file.name, file.language, file.text
                );
                (user(text), None)
            }
            Kind::Prose => {
                let text = format!(
                    "Write a long, vivid essay about a {} {} who finds a {} {} in an old {}. Describe the places, the \
                     people and what changes for them over one year.",
                    rng.word(),
                    rng.pick(&["teacher", "doctor", "farmer", "painter", "sailor"]),
                    rng.word(),
                    rng.word(),
                    rng.pick(&["library", "harbor", "castle", "village", "market"]),
                );
                (user(text), None)
            }
            Kind::Extract => {
                let (first, last) = (rng.pick(FIRST_NAMES), rng.pick(LAST_NAMES));
                let express = rng.below(2) == 0;
                let paragraph = format!(
                    "Hello, this is {first} {last}. I am {} years old and live in {}. On {} I ordered {} of your {} \
                     (order {}-{:05}) at {}.{:02} dollars each, and I {} express shipping. Please write back to {}.{}@example.com \
                     if anything is missing, since I need everything before my {} trip.",
                    18 + rng.below(60),
                    rng.pick(CITIES),
                    rng.pick(&["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]),
                    1 + rng.below(9),
                    rng.pick(PRODUCTS),
                    rng.pick(&["ORD", "WEB", "SHOP"]),
                    rng.below(100_000),
                    5 + rng.below(300),
                    rng.below(100),
                    if express { "paid for" } else { "did not choose" },
                    first.to_lowercase(),
                    last.to_lowercase(),
                    rng.word(),
                );
                let text = format!("Extract the order details from this customer message as JSON.\n\n{paragraph}");
                let format = json!({"type": "json_schema",
                                    "json_schema": {"name": "order", "strict": true, "schema": extract_schema()}});
                (user(text), Some(format))
            }
        };
        Request {
            messages,
            response_format,
            temperature: self.temperature,
            top_p: self.top_p,
            key_slot,
            ignore_eos: false,
            max_tokens: None,
        }
    }
}

#[cfg(test)]
#[path = "workloads_tests.rs"]
mod tests;
