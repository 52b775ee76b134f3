//! OpenAI's Embeddings (`POST /v1/embeddings`): the request, validated with OpenAI's 400s, and
//! the `list` of `embedding` objects it answers with, floats or base64 (the little-endian bytes
//! of each f32, which the `openai` SDKs ask for by default and decode).

use base64::Engine as _;
use serde_json::{json, Value};

use crate::completions::{body_object, parse_inputs, request_object, PromptInput};
use crate::fields::{get, opt_int, opt_str, type_error};
use crate::ApiError;

/// Most inputs one request may carry, as OpenAI allows.
pub const MAX_INPUTS: usize = 2048;

/// How vectors are written in the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    Float,
    Base64,
}

/// An embeddings request, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingRequest {
    pub model: String,
    /// Texts or token ids, each embedded on its own.
    pub inputs: Vec<PromptInput>,
    pub encoding_format: EncodingFormat,
    /// The length the client wants each vector cut to (a Matryoshka model's); checked against
    /// the model once it is known.
    pub dimensions: Option<usize>,
}

const KNOWN_FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

/// Parses and validates an Embeddings request body. `null` is absent.
pub fn parse_embedding_request(body: &[u8]) -> Result<EmbeddingRequest, ApiError> {
    let value = request_object(body, KNOWN_FIELDS)?;
    let obj = body_object(&value)?;
    let model = match get(obj, "model") {
        None => return Err(ApiError::invalid_request("you must provide a model parameter", None)),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(type_error("model", "a string", other)),
    };
    let inputs = match get(obj, "input") {
        None => return Err(ApiError::invalid_value("input", "Missing required parameter: 'input'.")),
        Some(v) => parse_inputs("input", v, MAX_INPUTS)?,
    };
    let encoding_format = match opt_str(obj, "encoding_format", "encoding_format")?.as_deref() {
        None | Some("float") => EncodingFormat::Float,
        Some("base64") => EncodingFormat::Base64,
        Some(other) => {
            return Err(ApiError::invalid_value(
                "encoding_format",
                format!("Invalid value for 'encoding_format': '{other}'. Supported values are: 'float' and 'base64'."),
            ))
        }
    };
    let dimensions = opt_int(obj, "dimensions", 1, i64::from(u32::MAX))?.map(|d| d as usize);
    opt_str(obj, "user", "user")?;
    Ok(EmbeddingRequest { model, inputs, encoding_format, dimensions })
}

/// The answer: one `embedding` object per vector, in input order, and the usage billed.
pub fn embedding_list(model: &str, vectors: &[Vec<f32>], format: EncodingFormat, prompt_tokens: u64) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match format {
                EncodingFormat::Float => json!(v),
                EncodingFormat::Base64 => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<EmbeddingRequest, ApiError> {
        parse_embedding_request(v.to_string().as_bytes())
    }

    #[test]
    fn inputs_are_texts_or_token_arrays() {
        let r = parse(json!({"model": "m", "input": "hi"})).unwrap();
        assert_eq!(r.inputs, [PromptInput::Text("hi".into())]);
        assert_eq!(r.encoding_format, EncodingFormat::Float);
        let r = parse(json!({"model": "m", "input": ["a", "b"], "encoding_format": "base64"})).unwrap();
        assert_eq!(r.inputs.len(), 2);
        assert_eq!(r.encoding_format, EncodingFormat::Base64);
        let r = parse(json!({"model": "m", "input": [1, 2, 3]})).unwrap();
        assert_eq!(r.inputs, [PromptInput::Tokens(vec![1, 2, 3])]);
        let r = parse(json!({"model": "m", "input": [[1], [2, 3]], "dimensions": 384, "user": "u"})).unwrap();
        assert_eq!(r.inputs, [PromptInput::Tokens(vec![1]), PromptInput::Tokens(vec![2, 3])]);
        assert_eq!(r.dimensions, Some(384));
    }

    #[test]
    fn bad_requests_name_their_field() {
        let param = |v: Value| parse(v).unwrap_err().param;
        assert_eq!(param(json!({"model": "m"})).as_deref(), Some("input"));
        assert_eq!(param(json!({"model": "m", "input": []})).as_deref(), Some("input"));
        assert_eq!(param(json!({"model": "m", "input": [[]]})).as_deref(), Some("input[0]"));
        assert_eq!(param(json!({"model": "m", "input": [-1]})).as_deref(), Some("input"));
        assert_eq!(
            param(json!({"model": "m", "input": "x", "encoding_format": "int8"})).as_deref(),
            Some("encoding_format")
        );
        assert_eq!(param(json!({"model": "m", "input": "x", "dimensions": 0})).as_deref(), Some("dimensions"));
        assert_eq!(param(json!({"model": "m", "input": "x", "temperature": 1})).as_deref(), Some("temperature"));
        let many: Vec<String> = (0..=MAX_INPUTS).map(|i| i.to_string()).collect();
        assert_eq!(param(json!({"model": "m", "input": many})).as_deref(), Some("input"));
        assert!(parse(json!({"input": "x"})).unwrap_err().message.contains("model"));
        assert_eq!(parse_embedding_request(b"{").unwrap_err().status.as_u16(), 400);
    }

    #[test]
    fn base64_is_each_floats_little_endian_bytes() {
        let v = vec![vec![1.0f32, -0.5]];
        let float = embedding_list("m", &v, EncodingFormat::Float, 3);
        assert_eq!(float["data"][0]["embedding"], json!([1.0, -0.5]));
        assert_eq!(float["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));
        let b64 = embedding_list("m", &v, EncodingFormat::Base64, 3);
        let bytes =
            base64::engine::general_purpose::STANDARD.decode(b64["data"][0]["embedding"].as_str().unwrap()).unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-0.5f32).to_le_bytes()].concat());
        assert_eq!(b64["object"], "list");
        assert_eq!(b64["data"][0]["object"], "embedding");
    }
}
