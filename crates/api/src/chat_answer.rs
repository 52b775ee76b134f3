//! A whole (non-streamed) chat answer, folded from the same [`ChatDelta`]s the streams render:
//! the text, thinking, tool calls, logprobs and finish of each choice. Every dialect's collected
//! answer is built from this fold, so a streamed answer and a collected one say the same thing
//! (tool calls read out of the text once, by the same reader).

use crate::{
    ApiError, ChatDelta, Choice, ChoiceLogprobs, FinishReason, ResponseMessage, TokenLogprob, ToolCall, Usage,
};

/// The choices of an answer so far; [`take`](Self::take) each delta in order.
#[derive(Debug)]
pub struct ChatAnswer {
    choices: Vec<ChoiceSoFar>,
    with_logprobs: bool,
}

#[derive(Debug, Default)]
struct ChoiceSoFar {
    text: String,
    reasoning: Option<String>,
    calls: Vec<ToolCall>,
    logprobs: Vec<TokenLogprob>,
    finish: Option<(FinishReason, Option<String>)>,
}

impl ChatAnswer {
    /// An answer of `n` choices; `with_logprobs`: the request asked for them.
    pub fn new(n: u32, with_logprobs: bool) -> Self {
        Self { choices: (0..n).map(|_| ChoiceSoFar::default()).collect(), with_logprobs }
    }

    /// Takes the next delta: `Ok(Some(usage))` once the answer is complete, `Err` when it failed.
    pub fn take(&mut self, delta: ChatDelta) -> Result<Option<Usage>, ApiError> {
        match delta {
            ChatDelta::Text { choice, text, logprobs } => {
                let c = self.choice(choice);
                c.text.push_str(&text);
                c.logprobs.extend(logprobs.into_iter().flatten());
            }
            ChatDelta::Reasoning { choice, text } => {
                self.choice(choice).reasoning.get_or_insert_default().push_str(&text);
            }
            ChatDelta::ToolCallStart { choice, index, id, name } => {
                let calls = &mut self.choice(choice).calls;
                debug_assert_eq!(index, calls.len(), "calls open in order");
                calls.push(ToolCall { id, name, arguments: String::new() });
            }
            ChatDelta::ToolCallArguments { choice, index, fragment } => {
                if let Some(call) = self.choice(choice).calls.get_mut(index) {
                    call.arguments.push_str(&fragment);
                }
            }
            ChatDelta::Finished { choice, reason, stop_sequence } => {
                self.choice(choice).finish = Some((reason, stop_sequence));
            }
            ChatDelta::Done { usage } => return Ok(Some(usage)),
            ChatDelta::Error(error) => return Err(error),
            ChatDelta::PromptCached { .. } | ChatDelta::TurnStart { .. } => {}
        }
        Ok(None)
    }

    fn choice(&mut self, index: u32) -> &mut ChoiceSoFar {
        &mut self.choices[index as usize]
    }

    /// The choices as Chat Completions answers them, and the stop string that ended each (the
    /// Messages dialect reports it). The content of a choice that called tools is the text
    /// around its calls, or `null` when there was none.
    pub fn into_choices(self) -> (Vec<Choice>, Vec<Option<String>>) {
        let with_logprobs = self.with_logprobs;
        self.choices
            .into_iter()
            .enumerate()
            .map(|(index, c)| {
                let (finish_reason, stop_sequence) = c.finish.unwrap_or((FinishReason::Length, None));
                let (content, tool_calls) = if c.calls.is_empty() {
                    (Some(c.text), None)
                } else {
                    ((!c.text.is_empty()).then_some(c.text), Some(c.calls))
                };
                let choice = Choice {
                    index: index as u32,
                    message: ResponseMessage { role: "assistant", content, tool_calls, reasoning: c.reasoning },
                    logprobs: with_logprobs.then_some(ChoiceLogprobs { content: c.logprobs }),
                    finish_reason,
                };
                (choice, stop_sequence)
            })
            .unzip()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(choice: u32, text: &str) -> ChatDelta {
        ChatDelta::Text { choice, text: text.into(), logprobs: None }
    }

    fn usage() -> Usage {
        Usage { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5, ..Usage::default() }
    }

    #[test]
    fn text_thinking_and_the_stop_string_fold_per_choice() {
        let mut answer = ChatAnswer::new(2, false);
        for d in [
            ChatDelta::TurnStart { choice: 0, forced_call: false },
            ChatDelta::Reasoning { choice: 1, text: "hm".into() },
            text(0, "Hel"),
            text(1, "Yes"),
            text(0, "lo"),
            ChatDelta::Finished { choice: 1, reason: FinishReason::Stop, stop_sequence: Some("END".into()) },
            ChatDelta::Finished { choice: 0, reason: FinishReason::Length, stop_sequence: None },
        ] {
            assert_eq!(answer.take(d).unwrap(), None);
        }
        assert_eq!(answer.take(ChatDelta::Done { usage: usage() }).unwrap(), Some(usage()));
        let (choices, stops) = answer.into_choices();
        assert_eq!(stops, [None, Some("END".to_string())]);
        assert_eq!(choices[0].message.content.as_deref(), Some("Hello"));
        assert_eq!((choices[0].finish_reason, choices[0].message.reasoning.as_deref()), (FinishReason::Length, None));
        assert_eq!(choices[1].message.reasoning.as_deref(), Some("hm"));
        assert!(choices.iter().all(|c| c.logprobs.is_none() && c.message.tool_calls.is_none()));
    }

    #[test]
    fn calls_gather_their_arguments_and_leave_no_content_when_there_was_no_text() {
        let mut answer = ChatAnswer::new(1, true);
        let lp = TokenLogprob { token: "x".into(), logprob: -0.5, bytes: vec![120], top_logprobs: vec![] };
        for d in [
            ChatDelta::ToolCallStart { choice: 0, index: 0, id: "call_1".into(), name: "f".into() },
            ChatDelta::ToolCallArguments { choice: 0, index: 0, fragment: "{\"a\":".into() },
            ChatDelta::Text { choice: 0, text: String::new(), logprobs: Some(vec![lp.clone()]) },
            ChatDelta::ToolCallArguments { choice: 0, index: 0, fragment: "1}".into() },
            ChatDelta::Finished { choice: 0, reason: FinishReason::ToolCalls, stop_sequence: None },
        ] {
            answer.take(d).unwrap();
        }
        let (choices, _) = answer.into_choices();
        let message = &choices[0].message;
        assert_eq!(message.content, None);
        let calls = message.tool_calls.as_ref().unwrap();
        assert_eq!((calls[0].id.as_str(), calls[0].name.as_str()), ("call_1", "f"));
        assert_eq!(calls[0].arguments, "{\"a\":1}");
        assert_eq!(choices[0].logprobs.as_ref().unwrap().content, [lp]);
        assert_eq!(choices[0].finish_reason, FinishReason::ToolCalls);
    }

    #[test]
    fn an_error_ends_the_fold_with_it() {
        let mut answer = ChatAnswer::new(1, false);
        answer.take(text(0, "partial")).unwrap();
        let failed = answer.take(ChatDelta::Error(ApiError::internal("boom"))).unwrap_err();
        assert_eq!(failed.wire_message(), "boom");
    }
}
