//! Constrained decoding with llguidance: output that must be JSON is sampled under a grammar,
//! so it always parses and matches its schema.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use lru::LruCache;
use serde_json::{json, Value};

use crate::kv::scope::CacheScope;

/// What a completion must conform to.
#[derive(Debug, Clone, PartialEq)]
pub enum Constraint {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// A document valid against this JSON schema.
    JsonSchema(Value),
    /// A Lark grammar (llguidance's dialect, `%json {…}` included), for tool-call formats.
    Lark(String),
}

impl Constraint {
    /// The grammar's whole source, what compiled grammars are cached by: equal keys compile to
    /// the same grammar, and no two different grammars share one (no hashing, no collisions).
    fn cache_key(&self) -> String {
        match self {
            Constraint::JsonObject => "json_object".into(),
            Constraint::JsonSchema(s) => format!("json_schema:{s}"),
            Constraint::Lark(lark) => format!("lark:{lark}"),
        }
    }

    fn grammar(&self) -> TopLevelGrammar {
        let mut schema = match self {
            Constraint::JsonObject => json!({"type": "object"}),
            Constraint::JsonSchema(s) => s.clone(),
            Constraint::Lark(lark) => return TopLevelGrammar::from_lark(lark.clone()),
        };
        if let Some(obj) = schema.as_object_mut() {
            obj.entry("x-guidance").or_insert_with(json_layout);
        }
        TopLevelGrammar::from_json_schema(schema)
    }
}

/// `schema` with the keywords its grammar cannot enforce (`uniqueItems`, `not`, `if`/`then`,
/// `contains`, an unknown `format`, …) skipped instead of refused: what a schema sent without
/// `strict` asks, which OpenAI does not enforce at all. Everything else is still enforced.
pub fn lenient(mut schema: Value) -> Value {
    drop_unparsable_patterns(&mut schema);
    if let Some(obj) = schema.as_object_mut() {
        let mut options = obj.remove("x-guidance").unwrap_or_else(json_layout);
        options["lenient"] = true.into();
        obj.insert("x-guidance".into(), options);
    }
    schema
}

/// `pattern`s (and `patternProperties` keys) the grammar's regex engine cannot read, removed:
/// ECMAScript's lookarounds and backreferences, common in hand-written patterns (an e-mail
/// check), have no finite automaton. llguidance's `lenient` skips unknown keywords, not these.
fn drop_unparsable_patterns(schema: &mut Value) {
    let readable = |pattern: &str| llguidance::derivre::RegexBuilder::new().mk_regex_for_serach(pattern).is_ok();
    match schema {
        Value::Object(obj) => {
            if obj.get("pattern").and_then(Value::as_str).is_some_and(|p| !readable(p)) {
                obj.remove("pattern");
            }
            if let Some(Value::Object(by_pattern)) = obj.get_mut("patternProperties") {
                by_pattern.retain(|p, _| readable(p));
            }
            for (key, child) in obj.iter_mut() {
                // Values, not schemas: left as the client wrote them.
                if !matches!(key.as_str(), "const" | "enum" | "default" | "examples") {
                    drop_unparsable_patterns(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(drop_unparsable_patterns),
        _ => {}
    }
}

/// The whitespace a JSON grammar allows between tokens: one space, or a line break or two and
/// up to 20 spaces or tabs of indentation (llama.cpp's JSON grammars allow the same). These
/// models write indented JSON on their own (`{\n  "a": 1,\n  "b": 2\n}`): forcing compact JSON
/// forces a token they rate about e^-5 at the first brace and keeps them off their own layout
/// after it (on `scripts/measure-extraction.py` the answer's mean token logprob went from -0.35
/// to -0.11, values 39 vs 38 of 40 right). Bounded, unlike free whitespace, so a small model
/// cannot emit newlines forever: each gap holds at most 22 characters before a JSON token.
fn json_layout() -> Value {
    json!({"whitespace_flexible": false, "whitespace_pattern": "\\x20|\\n{1,2}[\\x20\\t]{0,20}", "key_separator": ":", "item_separator": ","})
}

/// The model's vocabulary as llguidance sees it, tokenizing with the model's own tokenizer.
///
/// A canonical tokenizer is what lets llguidance compute the tokens a grammar forces (a key, a
/// `":`, the rest of an enum value): the byte-trie alone only approximates how the model
/// tokenizes, so llguidance refuses to force anything with it. With it, a forced stretch is
/// sampled as the tokens the model's tokenizer writes for it (llama.cpp's llguidance sampler
/// does the same), and the scheduler can feed those tokens ahead as drafts (`speculation`).
struct LlamaTokEnv {
    trie: TokTrie,
    model: Arc<LlamaModel>,
}

impl TokenizerEnv for LlamaTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // llama.cpp's pre-tokenizers expect UTF-8 (invalid input would throw across the FFI):
        // a stretch that splits a character is tokenized greedily by the trie instead.
        if std::str::from_utf8(s).is_err() {
            return self.trie.greedy_tokenize(s);
        }
        let tokens: Vec<TokenId> =
            self.model.vocab().tokenize(s, false, false).into_iter().map(|t| t.0 as TokenId).collect();
        // Some tokenizers do not spell the text back byte for byte (SentencePiece vocabularies
        // add a leading space): forcing their tokens would write what the grammar did not ask
        // for, so those fall back to the trie too.
        if self.trie.decode_raw(&tokens) != s {
            return self.trie.greedy_tokenize(s);
        }
        tokens
    }

    fn tokenize_is_canonical(&self) -> bool {
        true
    }
}

fn tok_env(model: &Arc<LlamaModel>) -> TokEnv {
    let approximate = LlamaSampler::llguidance_tok_env(model);
    Arc::new(LlamaTokEnv { trie: approximate.tok_trie().clone(), model: Arc::clone(model) })
}

/// Compiled grammars one model keeps, most recently used kept first. A JSON schema of the
/// largest accepted size compiles in tens of milliseconds; clients send the same few schemas
/// and tool lists again and again, so those compile once.
pub const GRAMMAR_CACHE_ENTRIES: usize = 64;

/// A grammar compiled for one model, not yet started: matchers are instantiated from it
/// (a deep copy) without compiling again. Compiled in `prepare`, off the scheduler thread.
pub struct CompiledGrammar(TokenParser);

impl CompiledGrammar {
    /// A matcher at the grammar's start.
    pub(crate) fn matcher(&self) -> Result<Matcher, String> {
        self.matcher_after(&[])
    }

    /// A matcher that has consumed `tokens` (a tool call the model started on its own); fails
    /// if they do not fit the grammar.
    pub(crate) fn matcher_after(&self, tokens: &[i32]) -> Result<Matcher, String> {
        let mut matcher = Matcher::new(Ok(self.0.deep_clone()));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        let tokens: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        matcher.consume_tokens(&tokens).map_err(|e| e.to_string())?;
        Ok(matcher)
    }
}

/// The grammars `prepare` compiled for a request, handed to the scheduler with it so that
/// admitting it to a slot compiles nothing. A field left `None` (a request not made by
/// `prepare`) is compiled when needed, through the same cache.
#[derive(Debug, Clone, Default)]
pub struct PreparedGrammars {
    /// The whole output's grammar (`GenerateRequest::constraint`).
    pub output: Option<CompiledGrammar>,
    /// `LazyTools::bare`, for a bare JSON call the model starts on its own.
    pub bare_call: Option<CompiledGrammar>,
    /// `LazyTools::tagged`, for a call after the model's `<tool_call>` tag.
    pub tagged_call: Option<CompiledGrammar>,
    /// `tools::fenced_call_grammar` of `LazyTools::fenced_calls_rules`, for a ```json fence.
    pub fenced_call: Option<CompiledGrammar>,
    /// The `response_format`'s own grammar when `output` is the answer-or-call union (`auto`
    /// tools beside a `response_format`), on a model with a `<tool_call>` tag token: the output
    /// is held to it unless the model's own first choice is the tag (see `Sampler::gate`).
    pub answer: Option<CompiledGrammar>,
}

impl Clone for CompiledGrammar {
    fn clone(&self) -> Self {
        Self(self.0.deep_clone())
    }
}

impl std::fmt::Debug for CompiledGrammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompiledGrammar")
    }
}

/// The parser factory of one model, built on first use (walking a 150k-token vocabulary takes
/// a noticeable fraction of a second, so it is done once, not per request), and the grammars
/// compiled with it, by their source.
pub(crate) struct Grammars {
    factory: OnceLock<Result<ParserFactory, String>>,
    compiled: Mutex<LruCache<String, TokenParser>>,
    /// Grammars compiled (cache misses) since the model loaded.
    compiles: AtomicUsize,
}

impl Grammars {
    pub(crate) fn new() -> Self {
        let entries = NonZeroUsize::new(GRAMMAR_CACHE_ENTRIES).expect("the grammar cache holds some entries");
        Self { factory: OnceLock::new(), compiled: Mutex::new(LruCache::new(entries)), compiles: AtomicUsize::new(0) }
    }

    fn factory(&self, model: &Arc<LlamaModel>) -> Result<&ParserFactory, String> {
        self.factory
            .get_or_init(|| {
                let mut factory = ParserFactory::new_simple(&tok_env(model)).map_err(|e| e.to_string())?;
                // Schema errors are returned to the client, not printed on the server's stderr.
                factory.set_stderr_log_level(0);
                Ok(factory)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Builds the parser factory now (it takes a while), compiling no grammar.
    pub(crate) fn warm(&self, model: &Arc<LlamaModel>) {
        let _ = self.factory(model);
    }

    /// A matcher enforcing `constraint` on output that already began with `tokens` (a tool call
    /// the model started on its own); fails if those tokens do not fit the grammar.
    pub(crate) fn matcher_after(
        &self,
        model: &Arc<LlamaModel>,
        constraint: &Constraint,
        scope: CacheScope,
        tokens: &[i32],
    ) -> Result<Matcher, String> {
        self.compile(model, constraint, scope)?.matcher_after(tokens)
    }

    /// `constraint` compiled, from the cache when the same source was compiled before in the same
    /// cache scope, or why it does not compile (not cached: a broken schema costs its sender each
    /// time). Entries are apart by scope: a hit is faster than a compile, and another tenant must
    /// not learn from the timing which schemas were used recently.
    pub(crate) fn compile(
        &self,
        model: &Arc<LlamaModel>,
        constraint: &Constraint,
        scope: CacheScope,
    ) -> Result<CompiledGrammar, String> {
        let key = format!("{}:{}", scope.0, constraint.cache_key());
        if let Some(parser) = self.cached().get(&key) {
            return Ok(CompiledGrammar(parser.deep_clone()));
        }
        let factory = self.factory(model)?;
        self.compiles.fetch_add(1, Ordering::Relaxed);
        let compile = || {
            let compiled =
                CompiledGrammar(factory.create_parser(constraint.grammar()).map_err(|e| reason(&e.to_string()))?);
            probe_first_steps(&compiled)?;
            Ok(compiled)
        };
        // llguidance's compiler recurses once per property of an object: a schema of ten
        // thousand one-letter properties (well within the size limit) overflowed a 2 MiB thread
        // stack and aborted the process. Its own thread's stack is reserved, not committed.
        let compiled = std::thread::scope(|scope| {
            let compiling = std::thread::Builder::new().name("grammar-compile".into()).stack_size(COMPILE_STACK_BYTES);
            match compiling.spawn_scoped(scope, compile) {
                Ok(thread) => thread.join().unwrap_or_else(|_| Err("the grammar compiler panicked".to_string())),
                Err(e) => Err(format!("no thread to compile the grammar on: {e}")),
            }
        })?;
        self.cached().put(key, compiled.0.deep_clone());
        Ok(compiled)
    }

    fn cached(&self) -> std::sync::MutexGuard<'_, LruCache<String, TokenParser>> {
        self.compiled.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Grammars compiled since the model loaded: cache misses.
    pub(crate) fn compiles(&self) -> usize {
        self.compiles.load(Ordering::Relaxed)
    }
}

/// The stack grammars compile on (see `Grammars::compile`): ten thousand properties compiled
/// within 8 MiB; the widest schema the size limit lets through has about twelve thousand.
const COMPILE_STACK_BYTES: usize = 64 << 20;

/// Tokens allowed at a grammar's start beyond which [`probe_first_steps`] does not look further.
const PROBED_FIRST_TOKENS: usize = 32;

/// Some errors show only once a grammar starts (a schema no document can match), or at its
/// first masks (llguidance's limits on one step's work: the row after an object's `{` when it
/// has hundreds of optional properties). The mask at the start is computed, and, where few
/// tokens may open the output (`{`, `{"`, a space), the mask after each: such a grammar is
/// refused before its request runs. One failing later still ends its request with an error
/// (`Sampler::grammar_failed`), never sampled without it.
fn probe_first_steps(compiled: &CompiledGrammar) -> Result<(), String> {
    let mut start = compiled.matcher()?;
    let first = start.compute_mask().map_err(|e| reason(&e.to_string()))?;
    if first.num_set() > PROBED_FIRST_TOKENS {
        return Ok(());
    }
    for token in first.to_list() {
        let mut next = start.deep_clone();
        // The token was allowed: failing to take it is the grammar failing, as is its mask.
        next.consume_token(token).map_err(|e| reason(&e.to_string()))?;
        if !next.is_stopped() {
            next.compute_mask().map_err(|e| reason(&e.to_string()))?;
        }
    }
    Ok(())
}

/// Why a grammar does not compile, as a client can read it: a Lark grammar's error (the tools'
/// grammars embed the argument schemas in one) names its line and quotes the grammar's source
/// after it, kilobytes of this server's wrappers; the reason is on the first line.
pub(crate) fn reason(error: &str) -> String {
    let first = error.lines().next().unwrap_or(error);
    let unplaced = first
        .strip_prefix("at ")
        .and_then(|rest| rest.split_once("): "))
        .filter(|(place, _)| place.chars().all(|c| c.is_ascii_digit() || c == '('))
        .map_or(first, |(_, reason)| reason);
    let unplaced = unplaced.strip_prefix("failed to compile JSON schema: ").unwrap_or(unplaced);
    // The regex parser's reason is on its last line, after the pattern and a caret line.
    if let Some(head) = unplaced.strip_suffix("regex parse error:") {
        let mut rest = error.lines().skip(1);
        let pattern = rest.next().map(str::trim).unwrap_or_default();
        if let Some(why) = rest.find_map(|l| l.strip_prefix("error: ")) {
            return format!("{head}regex parse error in pattern {pattern:?}: {why}");
        }
    }
    unplaced.to_owned()
}

#[cfg(test)]
mod lenient_tests {
    use serde_json::json;

    #[test]
    fn patterns_without_an_automaton_are_dropped_and_the_others_kept() {
        let schema = json!({"type": "object", "properties": {
            "email": {"type": "string", "pattern": "^(?!\\.)[A-Za-z0-9_.+-]+@[A-Za-z0-9.-]+$"},
            "twice": {"type": "string", "pattern": "(a)\\1"},
            "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d+$"},
            "pattern": {"type": "string", "const": "(?!kept)"}},
            "patternProperties": {"^x-": {"type": "string"}, "(?=y)": {"type": "string"}}});
        let lenient = super::lenient(schema);
        let props = &lenient["properties"];
        assert!(props["email"].get("pattern").is_none(), "{lenient}");
        assert!(props["twice"].get("pattern").is_none(), "{lenient}");
        assert_eq!(props["code"]["pattern"], "^[A-Z]{3}-\\d+$");
        assert_eq!(props["pattern"]["const"], "(?!kept)");
        let by_pattern: Vec<&String> = lenient["patternProperties"].as_object().unwrap().keys().collect();
        assert_eq!(by_pattern, ["^x-"]);
        assert_eq!(lenient["x-guidance"]["lenient"], true);
    }
}

#[cfg(test)]
mod reason_tests {
    #[test]
    fn a_grammar_error_keeps_its_reason_not_the_grammar() {
        let lark =
            "at 6(7): failed to compile JSON schema: Invalid type: banana\n   4 | WS: /[ ]+/\n   6 | body: %json {…}";
        assert_eq!(super::reason(lark), "Invalid type: banana");
        assert_eq!(super::reason("Invalid type: banana"), "Invalid type: banana");
        assert_eq!(super::reason("at the start: x"), "at the start: x");
        let regex = "regex parse error:\n    (a)\\1\n       ^^\nerror: backreferences are not supported";
        assert_eq!(super::reason(regex), r#"regex parse error in pattern "(a)\\1": backreferences are not supported"#);
    }
}
