//! KV-cache events for a prefix-aware router (llm-d's precise prefix-cache scorer), opt-in with
//! `--kv-events-endpoint`: the engines announce the virtual blocks their KV caches gain and lose
//! (`gantry_engine`'s `kv::blocks`), and this publisher sends them on a ZMQ PUB socket of its own,
//! in vLLM's format ([`wire`]), one topic per model: `kv@<pod>@<model>`.
//!
//! Events carry prompt tokens, so they are off unless asked for and go out on their own port,
//! never the API's. The engines hand events over a bounded channel and never wait for this task:
//! when it falls behind, events are dropped and counted (`gantry_kv_events_dropped_total`), and
//! the router's view of that pod is stale until the blocks change again.

pub(crate) mod wire;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use axum::body::Bytes;
use gantry_engine::{KvBlockEvent, KvEventSink};
use tokio::sync::mpsc;
use zeromq::{Socket, SocketSend, ZmqMessage};

/// Events waiting for the publisher before the engines start dropping them.
const CHANNEL_EVENTS: usize = 16_384;

/// Most events in one message.
const BATCH_EVENTS: usize = 512;

/// Where the events go: the address to bind a PUB socket at (`--kv-events-endpoint`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventsEndpoint(String);

impl std::str::FromStr for KvEventsEndpoint {
    type Err = String;

    /// `tcp://HOST:PORT`, where HOST `*` is every interface (vLLM's `tcp://*:5557`).
    fn from_str(s: &str) -> Result<Self, String> {
        let shape = || format!("{s:?} is not tcp://HOST:PORT (e.g. tcp://*:5557)");
        let address = s.strip_prefix("tcp://").ok_or_else(shape)?;
        let (host, port) = address.rsplit_once(':').ok_or_else(shape)?;
        port.parse::<u16>().map_err(|_| shape())?;
        let host = match host {
            "*" => "0.0.0.0",
            "" => return Err(shape()),
            host => host,
        };
        Ok(Self(format!("tcp://{host}:{port}")))
    }
}

/// Binds the PUB socket (a taken port or an unresolvable host stops the start) and starts the
/// task that publishes the events of the sinks [`Publisher::sink`] hands out.
pub(crate) async fn start(endpoint: &KvEventsEndpoint, pod: &str) -> anyhow::Result<Publisher> {
    let mut socket = zeromq::PubSocket::new();
    let bound =
        socket.bind(&endpoint.0).await.with_context(|| format!("binding --kv-events-endpoint {}", endpoint.0))?;
    tracing::info!(endpoint = %bound, pod, "publishing KV-cache events");
    metrics::describe_counter!(
        "gantry_kv_events_dropped_total",
        "KV-cache events dropped because the publisher fell behind."
    );
    let (tx, rx) = mpsc::channel(CHANNEL_EVENTS);
    tokio::spawn(publish(socket, rx, pod.to_string()));
    Ok(Publisher { tx })
}

/// Hands each engine its [`KvEventSink`].
pub(crate) struct Publisher {
    tx: mpsc::Sender<(Arc<str>, KvBlockEvent)>,
}

impl Publisher {
    /// The sink of the engine serving `model`, whose events go out under its topic. Its first
    /// event says nothing is cached: a router still indexing an earlier run of this pod, and
    /// subscribed already (a restarted container keeps its pod's address), forgets it.
    pub(crate) fn sink(&self, model: &str) -> KvEventSink {
        let _ = self.tx.try_send((model.into(), KvBlockEvent::AllCleared));
        KvEventSink::new(self.tx.clone(), model)
    }
}

/// Sends what arrives, in order, a batch per model and per wake-up, numbering messages as vLLM
/// does (from 0, one count for the socket). Ends when every sink is gone.
async fn publish(mut socket: zeromq::PubSocket, mut rx: mpsc::Receiver<(Arc<str>, KvBlockEvent)>, pod: String) {
    let mut sequence: u64 = 0;
    let mut pending = Vec::with_capacity(BATCH_EVENTS);
    while rx.recv_many(&mut pending, BATCH_EVENTS).await > 0 {
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        for run in pending.chunk_by(|a, b| a.0 == b.0) {
            let events: Vec<&KvBlockEvent> = run.iter().map(|(_, e)| e).collect();
            let frames = vec![
                Bytes::from(wire::topic(&pod, &run[0].0)),
                Bytes::copy_from_slice(&sequence.to_be_bytes()),
                Bytes::from(wire::payload(ts, &events)),
            ];
            let message = ZmqMessage::try_from(frames).expect("three frames");
            if let Err(e) = socket.send(message).await {
                tracing::warn!(error = %e, "could not publish KV-cache events");
            }
            sequence += 1;
        }
        pending.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_a_tcp_host_and_port() {
        let parsed = |s: &str| s.parse::<KvEventsEndpoint>().map(|e| e.0);
        assert_eq!(parsed("tcp://*:5557").unwrap(), "tcp://0.0.0.0:5557");
        assert_eq!(parsed("tcp://10.0.0.7:5557").unwrap(), "tcp://10.0.0.7:5557");
        for bad in ["5557", "tcp://*", "tcp://:5557", "tcp://*:port", "tcp://*:70000", "ipc:///tmp/kv"] {
            let error = parsed(bad).unwrap_err();
            assert!(error.contains("tcp://HOST:PORT"), "{bad}: {error}");
        }
    }
}
