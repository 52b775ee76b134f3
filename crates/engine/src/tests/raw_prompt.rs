//! Raw prompts (`/v1/completions`, `/infill`) through the engine on the tiny model: no template,
//! the prompt's tokens exactly what is billed, token prompts checked against the vocabulary, and
//! fill-in-the-middle refused on a vocabulary without FIM tokens.

use super::engine::{drain, eos, input, start};
use crate::{Fim, Generator, PrepareError, PromptSource, RawPrompt, RawPromptError};

fn raw(prompt: PromptSource, fim: Option<Fim>) -> RawPrompt {
    RawPrompt { prompt, fim }
}

#[tokio::test]
async fn a_text_prompt_is_decoded_as_it_tokenizes_and_billed_so() {
    let engine = start(1, None);
    let text = "hello there, raw prompt";
    let tokens = engine.tokenize(text, true, true);
    let request = engine.prepare_raw(input(3, vec![]), raw(PromptSource::Text(text.into()), None)).unwrap();
    assert_eq!(request.prompt.tokens, tokens, "no template around it");
    assert_eq!(request.prompt.text, text);
    let (_, usage) = drain(engine.submit(request).unwrap()).await;
    assert_eq!(usage.prompt_tokens as usize, tokens.len());
    // The same prompt as token ids is the same prompt.
    let request = engine.prepare_raw(input(3, vec![]), raw(PromptSource::Tokens(tokens.clone()), None)).unwrap();
    assert_eq!(request.prompt.tokens, tokens);
    engine.shutdown();
}

#[tokio::test]
async fn token_prompts_and_fim_are_checked_before_anything_runs() {
    let engine = start(1, None);
    let beyond = eos(&engine) + 1;
    let e = engine.prepare_raw(input(3, vec![]), raw(PromptSource::Tokens(vec![1, beyond]), None)).unwrap_err();
    assert!(
        matches!(e, PrepareError::RawPrompt(RawPromptError::TokenOutOfVocabulary { token, .. }) if token == beyond),
        "{e:?}"
    );
    let e = engine.prepare_raw(input(3, vec![]), raw(PromptSource::Tokens(Vec::new()), None)).unwrap_err();
    assert!(matches!(e, PrepareError::RawPrompt(RawPromptError::Empty)), "{e:?}");
    // The tiny vocabulary declares no FIM tokens.
    let fim = Fim { suffix: "\n    return x\n".into(), files: Vec::new(), cut_to_fit: false };
    let e = engine.prepare_raw(input(3, vec![]), raw(PromptSource::Text("def f(x):\n".into()), Some(fim))).unwrap_err();
    assert!(matches!(e, PrepareError::RawPrompt(RawPromptError::NoFim)), "{e:?}");
    assert!(e.to_string().contains("fill-in-the-middle"), "{e}");
    // A prompt longer than the context is the usual context error.
    let long = "word ".repeat(400);
    let e = engine.prepare_raw(input(3, vec![]), raw(PromptSource::Text(long), None)).unwrap_err();
    assert!(matches!(e, PrepareError::ContextLength { .. }), "{e:?}");
    engine.shutdown();
}
