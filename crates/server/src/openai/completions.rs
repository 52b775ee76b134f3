//! `/v1/completions`' ends of the request path (`crate::pipeline`): each prompt prepared as a
//! raw prompt (no template; a FIM prompt with a `suffix`) into its own engine job, and the
//! answer as one `text_completion` or its stream chunks. `/infill` (`crate::infill`) prepares
//! the same way and answers in llama.cpp's shape.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use gantry_api::completions::response::{LegacyLogprobs, TextChoice, TextCompletion};
use gantry_api::completions::{PromptInput, ValidatedCompletion};
use gantry_api::ApiError;
use gantry_engine::{ChatInput, Event, Fim, FimFile, FinishReason, GenerateRequest, PromptSource, RawPrompt};

use crate::errors::{task_failed, IntoApiError};
use crate::openai::convert::{to_api_logprobs, to_api_usage};
use crate::openai::deltas::next_event;
use crate::pool::Lease;

/// A completions request ready to submit: one job per prompt, and what its answer needs.
pub(crate) struct Prepared {
    pub jobs: Vec<GenerateRequest>,
    pub answer: AnswerPlan,
}

/// What the answer adds to the engine's events: each prompt's text where `echo` repeats it,
/// and the index of the FIM stop rule's first stop string (the rule's come last) with what a
/// choice it stopped gets.
#[derive(Debug, Clone, Default)]
pub(crate) struct AnswerPlan {
    pub echoes: Vec<String>,
    pub fim_stop: Option<(u32, &'static str)>,
    /// The index of `/infill`'s indentation limit's first stop string (they come after the FIM
    /// rule's): a choice one stopped ended by the limit, not a word.
    pub indent_stop: Option<u32>,
    /// Choices per prompt.
    pub n: u32,
}

impl AnswerPlan {
    fn echo_of(&self, choice: u32) -> &str {
        self.echoes.get((choice / self.n.max(1)) as usize).map_or("", String::as_str)
    }

    /// What a choice that stopped on stop string `index` gets appended (the FIM rule's tail; the
    /// indentation limit's are [`Self::indent_limited`]'s).
    pub(crate) fn tail(&self, index: u32) -> &'static str {
        let rule = self.fim_stop.filter(|(first, _)| index >= *first && !self.indent_limited(index));
        rule.map_or("", |(_, tail)| tail)
    }

    /// Whether stop string `index` is the indentation limit's: llama-server keeps the line
    /// break and indentation before the line it cut, which is that stop string but its last
    /// character.
    pub(crate) fn indent_limited(&self, index: u32) -> bool {
        self.indent_stop.is_some_and(|first| index >= first)
    }
}

/// Each prompt checked and tokenized by the engine (off the async runtime), its refusals the
/// client's 400s. `scope`: the key's prompt-cache scope.
pub(crate) async fn prepare(
    model: &Lease,
    c: &ValidatedCompletion,
    scope: gantry_engine::CacheScope,
) -> Result<Prepared, ApiError> {
    let chat = &c.chat;
    let mut stop = chat.stop.clone();
    // The FIM rule's stop strings come last: any index from the first of them is the rule's.
    let fim_stop = c.fim_stop().map(|rule| {
        let first = stop.len() as u32;
        stop.extend(rule.stops);
        (first, rule.tail)
    });
    let indent_stop = (c.n_indent > 0).then(|| {
        let first = stop.len() as u32;
        stop.extend(gantry_api::completions::indent_stops(c.n_indent));
        first
    });
    let input = ChatInput {
        messages: Vec::new(),
        tools: None,
        n: chat.n,
        max_tokens: chat.max_tokens,
        stop,
        sampling: crate::openai::chat::sampling_of(chat),
        logprobs: c.logprobs,
        constraint: None,
        lazy_tools: None,
        answer_constraint: None,
        cache_scope: scope,
        thinking: gantry_engine::Thinking::Default,
    };
    let fim = c.suffix.as_ref().map(|suffix| Fim {
        suffix: suffix.clone(),
        files: c.extra.iter().map(|f| FimFile { filename: f.filename.clone(), text: f.text.clone() }).collect(),
        cut_to_fit: c.cut_to_fit,
    });
    let raws: Vec<RawPrompt> = c
        .prompts
        .iter()
        .map(|p| RawPrompt {
            prompt: match p {
                PromptInput::Text(t) => PromptSource::Text(t.clone()),
                PromptInput::Tokens(t) => PromptSource::Tokens(t.clone()),
            },
            fim: fim.clone(),
        })
        .collect();
    let (echo, n) = (c.echo, chat.n);
    let engine = model.generator();
    let prepared = tokio::task::spawn_blocking(move || {
        let mut answer = AnswerPlan { echoes: Vec::new(), fim_stop, indent_stop, n };
        let mut jobs = Vec::with_capacity(raws.len());
        for raw in raws {
            if echo {
                answer.echoes.push(match &raw.prompt {
                    PromptSource::Text(t) => t.clone(),
                    PromptSource::Tokens(t) => engine.detokenize(t),
                });
            }
            jobs.push(engine.prepare_raw(input.clone(), raw)?);
        }
        Ok::<_, gantry_engine::PrepareError>(Prepared { jobs, answer })
    })
    .await
    .map_err(|e| task_failed("prompt preparation", e))?;
    prepared.map_err(in_prompt_terms)
}

/// The engine's refusal, a context overflow in OpenAI's Completions words (a prompt, not
/// messages).
fn in_prompt_terms(e: gantry_engine::PrepareError) -> ApiError {
    let gantry_engine::PrepareError::ContextLength { limit, prompt_tokens, max_tokens } = e else {
        return e.into_api_error();
    };
    let message = match max_tokens {
        Some(m) => format!(
            "This model's maximum context length is {limit} tokens, however you requested {} tokens ({prompt_tokens} in your prompt; {m} for the completion). Please reduce your prompt; or completion length.",
            u64::from(prompt_tokens) + u64::from(m)
        ),
        None => format!(
            "This model's maximum context length is {limit} tokens, however your prompt is {prompt_tokens} tokens. Please reduce your prompt."
        ),
    };
    let mut error = ApiError::context_length_exceeded(message);
    error.param = Some("prompt".into());
    error
}

/// The answer: SSE chunks, or one `text_completion`.
pub(crate) async fn respond(
    id: String,
    created: u64,
    model: String,
    c: &ValidatedCompletion,
    plan: AnswerPlan,
    choices: u32,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let encoder = Encoder { id, created, model, logprobs: c.logprobs.is_some(), plan, offsets: Vec::new() };
    if c.chat.stream {
        return Ok(stream_response(encoder, c.chat.include_usage, choices, events).into_response());
    }
    Ok(Json(collect(encoder, choices, events).await?).into_response())
}

/// Builds the `text_completion` objects; `offsets` counts each choice's characters so far, for
/// `text_offset` across chunks.
struct Encoder {
    id: String,
    created: u64,
    model: String,
    logprobs: bool,
    plan: AnswerPlan,
    offsets: Vec<usize>,
}

impl Encoder {
    fn object(&self, choices: Vec<TextChoice>, usage: Option<gantry_api::Usage>) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    /// A choice's next text; its logprobs' offsets continue from the choice's text so far.
    fn choice(
        &mut self,
        index: u32,
        text: String,
        lp: Vec<gantry_engine::TokenLogprob>,
        reason: Option<&'static str>,
    ) -> TextChoice {
        let offset = &mut self.offsets[index as usize];
        let logprobs = self.logprobs.then(|| {
            let (entries, _) = LegacyLogprobs::from_tokens(&to_api_logprobs(lp).content, *offset);
            entries
        });
        *offset += text.chars().count();
        TextChoice { text, index, logprobs, finish_reason: reason }
    }
}

async fn collect(
    mut enc: Encoder,
    choices: u32,
    mut events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Result<TextCompletion, ApiError> {
    let n = choices as usize;
    let mut texts: Vec<String> = (0..choices).map(|i| enc.plan.echo_of(i).to_string()).collect();
    let mut logprobs = vec![Vec::new(); n];
    let mut reasons = vec![FinishReason::Length; n];
    let usage = loop {
        match next_event(&mut events).await {
            Event::Delta { choice, text, logprobs: lp } => {
                texts[choice as usize].push_str(&text);
                logprobs[choice as usize].extend(lp);
            }
            Event::StopSequence { choice, index } => texts[choice as usize].push_str(enc.plan.tail(index)),
            Event::Finished { choice, reason } => reasons[choice as usize] = reason,
            Event::Done(usage) => break usage,
            Event::Error(error) => return Err(error.into_api_error()),
            Event::Cached { .. } | Event::Reasoning { .. } => {}
        }
    };
    enc.offsets = (0..choices).map(|i| enc.plan.echo_of(i).chars().count()).collect();
    let choices = texts
        .into_iter()
        .zip(logprobs)
        .zip(reasons)
        .enumerate()
        .map(|(i, ((text, lp), reason))| {
            let mut choice = enc.choice(i as u32, String::new(), lp, Some(reason.as_openai()));
            choice.text = text;
            choice
        })
        .collect();
    Ok(enc.object(choices, Some(to_api_usage(usage))))
}

fn stream_response(
    mut enc: Encoder,
    include_usage: bool,
    choices: u32,
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    enc.offsets = vec![0; choices as usize];
    // Echoed prompts open each choice, as OpenAI streams them.
    let mut opening = Vec::new();
    for i in 0..choices {
        let text = enc.plan.echo_of(i).to_string();
        if !text.is_empty() {
            let choice = enc.choice(i, text, Vec::new(), None);
            opening.push(serde_json::to_string(&enc.object(vec![choice], None)).unwrap_or_default());
        }
    }
    // The receiver moves into the stream: a client that leaves drops it, which cancels.
    let body = stream::unfold(Some((events, enc, Vec::<&'static str>::new())), move |state| async move {
        let (mut events, mut enc, mut tails) = state?;
        tails.resize(choices as usize, "");
        let frames: Vec<String> = match next_event(&mut events).await {
            Event::Delta { choice, text, logprobs } if !text.is_empty() || !logprobs.is_empty() => {
                let c = enc.choice(choice, text, logprobs, None);
                vec![serde_json::to_string(&enc.object(vec![c], None)).unwrap_or_default()]
            }
            Event::StopSequence { choice, index } => {
                tails[choice as usize] = enc.plan.tail(index);
                Vec::new()
            }
            Event::Finished { choice, reason } => {
                let c = enc.choice(choice, tails[choice as usize].to_string(), Vec::new(), Some(reason.as_openai()));
                vec![serde_json::to_string(&enc.object(vec![c], None)).unwrap_or_default()]
            }
            Event::Done(usage) => {
                let mut frames = Vec::new();
                if include_usage {
                    let last = enc.object(Vec::new(), Some(to_api_usage(usage)));
                    frames.push(serde_json::to_string(&last).unwrap_or_default());
                }
                frames.push("[DONE]".to_string());
                return Some((stream::iter(frames), None));
            }
            Event::Error(error) => {
                let frame = error.into_api_error().to_json().to_string();
                return Some((stream::iter(vec![frame]), None));
            }
            Event::Delta { .. } | Event::Cached { .. } | Event::Reasoning { .. } => Vec::new(),
        };
        Some((stream::iter(frames), Some((events, enc, tails))))
    })
    .flatten();
    let frames = stream::iter(opening).chain(body).map(|data| Ok(SseEvent::default().data(data)));
    Sse::new(frames).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}
