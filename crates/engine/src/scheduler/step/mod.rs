//! One scheduler step, a file per stage in the order it runs: [`admit`] takes waiting requests
//! into free sequences; the cache moves ([`cache_moves`]' shares and offloads, [`compact`]);
//! [`image`] evaluates one pending image; [`gather`] decides which batch lines sit the step out,
//! gathers what the requests offer and asks the pure [`plan`] for the step's rows, which
//! [`commit`] applies to the requests and the KV mirror; [`batch`] writes them into llama.cpp's
//! batch; after the decode [`cache_moves`] spreads finished prompts to their other choices and
//! [`verify`] samples every choice and walks its drafts. [`prefix_waits`], [`prompt_turns`] and
//! [`deterministic`] are rules the stages follow; [`graph_reuse`] reads what llama.cpp did with
//! its graph; [`buffers`] keeps the vectors the stages' values live in from one step to the next.

pub(crate) mod admit;
pub(crate) mod batch;
pub(crate) mod buffers;
pub(crate) mod cache_moves;
pub(crate) mod commit;
pub(crate) mod compact;
pub(crate) mod deterministic;
pub(crate) mod gather;
pub(crate) mod graph_reuse;
pub(crate) mod image;
pub(crate) mod plan;
pub(crate) mod prefix_waits;
pub(crate) mod prompt_turns;
pub(crate) mod verify;
