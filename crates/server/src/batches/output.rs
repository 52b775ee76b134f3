//! A finished batch's files, in OpenAI's line shape: the output file holds the lines answered
//! 200, the error file every other line, those never run (the batch was cancelled or expired)
//! with `batch_cancelled` or `batch_expired` and no response. Both are files of the batch's key
//! (`purpose: batch_output`), written in the one transaction that finishes the batch.

use gantry_accounts::{AccountsError, BatchLine, Finishable, NewFile};
use serde_json::{json, Value};

use crate::clock::now_secs;
use crate::state::AppState;

/// Writes `batch`'s files and finishes it, unless another server finished it first.
pub(super) async fn finish(state: &AppState, batch: &Finishable) -> Result<(), AccountsError> {
    let lines = state.accounts.batch_lines(&batch.id).await?;
    let (output, errors) = render(&lines, batch.to);
    let now = now_secs() as i64;
    let file = |content: String, kind: &str| NewFile {
        id: super::new_id("file-"),
        key_id: batch.key_id,
        purpose: "batch_output".into(),
        filename: format!("{}_{kind}.jsonl", batch.id),
        created_at: now,
        content,
    };
    let output = (!output.is_empty()).then(|| file(output, "output"));
    let errors = (!errors.is_empty()).then(|| file(errors, "error"));
    if let Some(done) = state.accounts.finish_batch(batch, now, output.as_ref(), errors.as_ref()).await? {
        tracing::info!(batch = %done.id, status = %done.status, completed = done.completed, failed = done.failed, "batches: finished");
    }
    Ok(())
}

/// The output and error files' contents (JSON lines, in input order) of a batch that becomes
/// `to`.
fn render(lines: &[BatchLine], to: &str) -> (String, String) {
    let (mut output, mut errors) = (String::new(), String::new());
    for line in lines {
        let (file, entry) = match (line.state.as_str(), line.status_code) {
            ("done", Some(status)) => {
                let body = line.response.as_deref().and_then(|b| serde_json::from_str::<Value>(b).ok());
                let response = json!({"status_code": status, "request_id": line.request_id, "body": body});
                let file = if status == 200 { &mut output } else { &mut errors };
                (file, json!({"id": line.request_id, "custom_id": line.custom_id, "response": response, "error": null}))
            }
            _ => {
                let error = match to {
                    "expired" => {
                        json!({"code": "batch_expired", "message": "This request could not be executed before the completion window expired."})
                    }
                    _ => {
                        json!({"code": "batch_cancelled", "message": "This request was not executed because the batch was cancelled."})
                    }
                };
                (
                    &mut errors,
                    json!({"id": line.request_id, "custom_id": line.custom_id, "response": null, "error": error}),
                )
            }
        };
        file.push_str(&entry.to_string());
        file.push('\n');
    }
    (output, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(n: i64, state: &str, status: Option<i64>, response: Option<&str>) -> BatchLine {
        BatchLine {
            line: n,
            custom_id: format!("c{n}"),
            request_id: format!("batch_req_{n}"),
            state: state.into(),
            status_code: status,
            response: response.map(str::to_owned),
        }
    }

    #[test]
    fn answered_lines_go_to_the_output_and_the_rest_to_the_error_file_in_order() {
        let lines = [
            line(1, "done", Some(200), Some(r#"{"object":"chat.completion"}"#)),
            line(2, "done", Some(400), Some(r#"{"error":{"message":"bad"}}"#)),
            line(3, "pending", None, None),
            line(4, "done", Some(200), Some(r#"{"object":"chat.completion","n":4}"#)),
        ];
        let (output, errors) = render(&lines, "cancelled");
        let output: Vec<Value> = output.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let errors: Vec<Value> = errors.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(output.iter().map(|l| l["custom_id"].as_str().unwrap()).collect::<Vec<_>>(), ["c1", "c4"]);
        assert_eq!(output[1]["response"]["body"]["n"], 4);
        assert_eq!(output[0]["response"]["status_code"], 200);
        assert_eq!(output[0]["id"], "batch_req_1");
        assert!(output[0]["error"].is_null());
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0]["response"]["status_code"], 400);
        assert_eq!(errors[0]["response"]["body"]["error"]["message"], "bad");
        assert!(errors[1]["response"].is_null());
        assert_eq!(errors[1]["error"]["code"], "batch_cancelled");
        let (_, expired) = render(&lines[2..3], "expired");
        assert!(expired.contains("batch_expired"), "{expired}");
    }
}
