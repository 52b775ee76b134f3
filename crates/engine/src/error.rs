//! How a request fails inside the engine once admitted, and why the engine refuses to queue one.

/// Why an admitted request failed inside the engine: never the client's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("The model failed to decode: {0}")]
    Decode(String),
    #[error("The server is shutting down; the request was cut.")]
    ShuttingDown,
    /// The scheduler thread panicked; the server stops so its supervisor restarts it.
    #[error("The inference engine failed ({0}); the server is restarting. Please retry.")]
    Crashed(String),
    /// Processing this one request panicked (a bug); it was ended and its sequences cleared,
    /// while every other request went on.
    #[error("The engine failed while generating this request ({0}); other requests were not affected. Please retry.")]
    RequestFailed(String),
    /// The output's grammar could not say which tokens may come next (llguidance's limits on
    /// one step's work, reached by a huge schema); the request ended rather than go on
    /// unconstrained.
    #[error("The output's grammar (response_format or tools) failed while generating: {0}. Simplify the schema (fewer optional properties or alternatives).")]
    GrammarFailed(String),
    /// Steps went by with the request neither given rows nor waiting on something that
    /// finishes (a scheduler bug, counted in `gantry_stalled_requests_total`): it ended rather
    /// than hang.
    #[error("The engine could make no progress on this request ({0}); it was ended. Please retry.")]
    Stalled(String),
    /// A batch's line or an unstreamed `flex` request was stopped for interactive work waiting
    /// for its sequence (`ActiveRequest::is_preemptible`); its owner runs it again later.
    #[error(
        "This request's capacity was taken by higher-tier work before it finished; it was not billed. Please retry."
    )]
    Preempted,
    /// A request `prepare` should have refused reached the scheduler anyway.
    #[error("The engine could not run this request: {0}")]
    Rejected(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the engine has stopped")]
    Stopped,
    #[error("{0} requests are already waiting; try again shortly")]
    QueueFull(usize),
    #[error("the inference engine failed ({0})")]
    Failed(String),
}

/// The text a caught panic carried, for the error its request ends with.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}
