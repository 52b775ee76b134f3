//! The tool watch of a running request (`tool_choice: "auto"`): each choice's output is watched
//! for the start of a tool call, and from there the call is sampled under its grammar.

use crate::constraint::Constraint;
use crate::faults::FaultPoint;
use crate::model::LoadedModel;
use crate::scheduler::request::ActiveRequest;
use crate::tools::{fenced_call_grammar, CallStart, CallWatch};

/// The output so far of a choice that may still start a tool call.
pub(crate) struct ToolWatch {
    tokens: Vec<i32>,
    /// Where each token's text ends in the output's bytes.
    ends: Vec<usize>,
    calls: CallWatch,
}

impl ToolWatch {
    pub(crate) fn new() -> Self {
        Self { tokens: Vec::new(), ends: Vec::new(), calls: CallWatch::new() }
    }

    pub(crate) fn call_may_follow(&self, names: &[String]) -> bool {
        self.calls.call_may_follow(names)
    }
}

impl ActiveRequest {
    /// With `tool_choice: "auto"`, the model may answer in text; once its output starts a tool
    /// call, the rest of the call is sampled under a grammar, so it parses and its arguments match
    /// the schema. Called after every token that does not end the generation.
    /// `piece` is the token's text, as the scheduler already decoded it.
    ///
    /// The model's native syntax (`<tool_call>`) switches to the call grammar at once. The fallback
    /// forms (bare JSON, a ```json fence) are also how models write answers — after a tool result,
    /// Qwen echoes the call with a `"result"` key as its answer — so they are only constrained once
    /// the output is committed to a call: `{"name": "<offered function>", "arguments": {` (or that
    /// inside `[`). Up to there the model samples freely; from there the grammar still lets the
    /// object go on with other keys, and such an object is then read back as content. A fenced
    /// call is constrained from its fence on, wherever it starts, by the grammar `prepare`
    /// compiled (`tools::fenced_call_grammar`): nothing is compiled here.
    ///
    /// Returns where in `piece` (the offset of its `>`) the `<tool_call>` tag's text ends when
    /// plain-text tokens wrote it on a model whose tag is a token of its own: not a call, but
    /// text the model copied (a client's).
    pub(crate) fn watch_for_tool_call(
        &mut self,
        i: usize,
        token: i32,
        piece: &[u8],
        model: &LoadedModel,
    ) -> Option<usize> {
        let lazy = self.lazy_tools.as_ref()?;
        let watch = self.choices[i].tool_watch.as_mut()?;
        watch.tokens.push(token);
        watch.ends.push(watch.ends.last().copied().unwrap_or(0) + piece.len());
        self.fault.check(FaultPoint::Watching, self.usage.completion_tokens);
        let tag_token = model.tool_call_tag().map(|tag| tag == token);
        let Some(start) = watch.calls.push(piece, &lazy.names, tag_token) else {
            return watch.calls.tag_end_in_last(piece.len()).filter(|_| tag_token == Some(false));
        };
        let fenced;
        let (constraint, consumed, compiled) = match start {
            CallStart::Tagged => (&lazy.tagged, &[][..], self.grammars.tagged_call.as_ref()),
            CallStart::Bare => (&lazy.bare, watch.tokens.as_slice(), self.grammars.bare_call.as_ref()),
            CallStart::Fenced { prefix } => {
                // From the token that holds the fence's first byte on; the grammar lets that
                // token's text before the fence lead.
                let first = watch.ends.partition_point(|&end| end <= prefix);
                fenced = Constraint::Lark(fenced_call_grammar(&lazy.fenced_calls_rules));
                (&fenced, &watch.tokens[first..], self.grammars.fenced_call.as_ref())
            }
        };
        let matcher = match compiled {
            Some(compiled) => compiled.matcher_after(consumed),
            None => model.constraint_matcher(constraint, self.scope, consumed),
        };
        match matcher {
            Ok(matcher) => {
                let c = &mut self.choices[i];
                c.sampler.constrain(c.drafter.follow_grammar(matcher));
                self.choices[i].tool_watch = None;
                self.choices[i].constrained = true;
            }
            Err(e) => {
                // The model's own layout does not fit the grammar: leave this call unconstrained
                // (the parser still reads a well-formed call) and watch for later ones.
                tracing::debug!(error = %e, ?start, "output does not start a tool call the grammar accepts");
                watch.calls.rejected(&start);
            }
        }
        None
    }
}
