//! Faults injected into one request's step, for tests only: they prove that a panic while one
//! request is sampled, watched for a tool call or turned into text ends that request alone.
//! Outside `cfg(test)` a [`Fault`] holds nothing and [`Fault::check`] does nothing, so no
//! binary built for use carries the hook.

/// Where in one request's step a fault fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultPoint {
    /// Sampling the next token (the sampler chain, a grammar included).
    Sampling,
    /// Watching the output for a tool call to constrain (`tool_choice: "auto"`).
    Watching,
    /// Turning a token into text: UTF-8 assembly and stop strings.
    Producing,
}

/// A request's planned fault: none, except in tests whose prompt carries the marker
/// `gantry-fault:<sampling|watching|producing>@<tokens>`, which panics at that point once the
/// request has produced `<tokens>` tokens.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Fault {
    #[cfg(test)]
    planned: Option<(FaultPoint, u32)>,
}

impl Fault {
    #[cfg(test)]
    pub fn from_prompt(text: &str) -> Self {
        let planned = text.split("gantry-fault:").nth(1).and_then(|rest| {
            let (point, after) = rest.split_once('@')?;
            let point = match point {
                "sampling" => FaultPoint::Sampling,
                "watching" => FaultPoint::Watching,
                "producing" => FaultPoint::Producing,
                _ => return None,
            };
            let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
            Some((point, digits.parse().ok()?))
        });
        Self { planned }
    }

    #[cfg(not(test))]
    pub fn from_prompt(_text: &str) -> Self {
        Self {}
    }

    /// Panics if this request planned a fault at `point` and has produced enough tokens.
    #[cfg(test)]
    pub fn check(&self, point: FaultPoint, produced: u32) {
        if let Some((at, after)) = self.planned {
            if at == point && produced >= after {
                panic!("injected fault: {point:?} after {produced} tokens");
            }
        }
    }

    #[cfg(not(test))]
    #[inline(always)]
    pub fn check(&self, _point: FaultPoint, _produced: u32) {}
}
