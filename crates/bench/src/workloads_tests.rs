//! Tests of `workloads.rs`: what each workload sends, the same for both servers.

use super::*;

fn workload(kind: Kind) -> Workload {
    let (temperature, top_p) = kind.sampling().unwrap_or((0.0, None));
    Workload {
        kind,
        prompt_tokens: 128,
        shared_prefix_tokens: 1500,
        max_tokens: 8,
        seed: 1,
        temperature,
        top_p,
        tenancy: None,
        traffic: None,
    }
}

fn text(r: &Request, msg: usize) -> &str {
    r.messages[msg]["content"].as_str().unwrap()
}

#[test]
fn chat_prompts_are_deterministic_distinct_and_sized() {
    let w = workload(Kind::Chat);
    assert_eq!(w.request(0, 4, 3), w.request(0, 4, 3));
    assert_ne!(w.request(0, 4, 3), w.request(0, 4, 4));
    assert_ne!(w.request(0, 4, 3), w.request(0, 8, 3));
    assert_ne!(w.request(0, 4, 3), w.request(1, 4, 3), "a new pass sends new prompts");
    let words = text(&w.request(0, 1, 0), 0).split_whitespace().count();
    assert!((80..140).contains(&words), "{words}");
}

#[test]
fn shared_prefix_is_shared_within_a_pass_and_new_in_the_next() {
    let s = workload(Kind::SharedPrefix);
    let (a, b) = (s.request(0, 8, 0), s.request(0, 8, 1));
    assert_eq!(a.messages[0], b.messages[0]);
    assert_ne!(a.messages[1], b.messages[1]);
    assert_ne!(a.messages[0], s.request(1, 8, 0).messages[0], "every pass starts cold");
    let sys_words = text(&a, 0).split_whitespace().count();
    assert!((1200..1500).contains(&sys_words), "{sys_words}");
}

#[test]
fn code_edit_sends_a_60_to_120_line_file_and_one_change() {
    let w = workload(Kind::CodeEdit);
    for source in &SOURCES {
        let lines = source.text.lines().count();
        assert!((60..=120).contains(&lines), "{} has {lines} lines", source.name);
    }
    let (a, b) = (w.request(0, 1, 0), w.request(0, 1, 1));
    assert!(text(&a, 0).contains("class Inventory:") && text(&a, 0).contains("Rename"));
    assert!(text(&b, 0).contains("pub struct Limiter"));
    assert_ne!(w.request(0, 1, 0), w.request(1, 1, 0), "the next pass asks for another change");
    assert!(a.response_format.is_none());
}

#[test]
fn extract_asks_for_every_schema_key() {
    let w = workload(Kind::Extract);
    let r = w.request(0, 1, 0);
    let format = r.response_format.clone().unwrap();
    assert_eq!(format["type"], "json_schema");
    let schema = &format["json_schema"]["schema"];
    let keys = schema["properties"].as_object().unwrap().len();
    assert!((6..=10).contains(&keys), "{keys}");
    assert_eq!(schema["required"].as_array().unwrap().len(), keys);
    assert!(text(&r, 0).contains("@example.com"));
    assert_ne!(w.request(0, 1, 0), w.request(0, 1, 1));
}

#[test]
fn sampled_requests_carry_their_sampling_the_same_for_both_servers() {
    let sampled = workload(Kind::ChatSampled);
    let (a, b) = (sampled.request(0, 8, 3), sampled.request(0, 8, 3));
    assert_eq!(a, b, "request i is the same whichever server it goes to");
    assert_eq!((a.temperature, a.top_p), (0.8, None));
    assert_eq!(a.messages, workload(Kind::Chat).request(0, 8, 3).messages, "chat's prompt");
    let top_p = workload(Kind::ChatTopP).request(1, 8, 0);
    assert_eq!((top_p.temperature, top_p.top_p), (0.8, Some(0.95)));
    let greedy = workload(Kind::Chat).request(0, 8, 3);
    assert_eq!((greedy.temperature, greedy.top_p), (0.0, None));
    assert!(!Kind::ChatSampled.gantry_only() && Kind::Chat.sampling().is_none());
}

#[test]
fn cache_scopes_share_a_system_prompt_per_combination_and_spread_over_tenants() {
    let [one, _, four_shared, four] = Tenancy::MEASURED;
    let w = |t: Tenancy| Workload { tenancy: Some(t), shared_prefix_tokens: 1000, ..workload(Kind::CacheScopes) };
    let (a, b) = (w(four).request(0, 2, 0), w(four).request(0, 2, 5));
    assert_eq!(a.messages[0], b.messages[0], "one system prompt for every request of a level");
    assert_ne!(a.messages[1], b.messages[1]);
    assert_eq!((a.key_slot, b.key_slot, w(four).request(0, 2, 7).key_slot), (0, 1, 3));
    assert_eq!(w(one).request(0, 2, 5).key_slot, 0);
    assert_ne!(a.messages[0], w(four_shared).request(0, 2, 0).messages[0], "each combination starts cold");
    assert_ne!(a.messages[0], w(four).request(1, 2, 0).messages[0], "each pass starts cold");
    let sys_words = text(&a, 0).split_whitespace().count();
    assert!((850..1050).contains(&sys_words), "{sys_words}");
    assert!(text(&a, 1).split_whitespace().count() < 12, "a short question: {}", text(&a, 1));
    assert_eq!(a.temperature, 0.8);
    assert_eq!(w(four).label(), "cache-scopes/4/tenant");
    assert_eq!(workload(Kind::ChatTopP).label(), "chat-top-p");
}

#[test]
fn traffic_sends_each_conversation_once_with_its_answers_length() {
    let conversations: Vec<Conversation> = (0..10)
        .map(|i| Conversation { prompt: format!("question {i}"), prompt_tokens: 3, max_tokens: 10 + i })
        .collect();
    let level =
        |offset, rate| TrafficLevel { conversations: Arc::new(conversations.clone()), offset, pass_stride: 5, rate };
    let w = |t: TrafficLevel| Workload { traffic: Some(t), ..workload(Kind::Traffic) };
    let closed = w(level(2, None));
    let r = closed.request(0, 8, 1);
    assert_eq!(text(&r, 0), "question 3");
    assert_eq!((r.max_tokens, r.ignore_eos, r.temperature), (Some(13), true, 0.0));
    assert_eq!(r, closed.request(0, 1, 1), "the same whatever the server or concurrency");
    assert_eq!(text(&closed.request(1, 8, 1), 0), "question 8", "the next pass moves on");
    assert_eq!(closed.label(), "traffic");
    assert_eq!(w(level(0, Some(0.25))).label(), "traffic@0.25/s");
    assert!(Kind::Traffic.first_pair_only() && !Kind::Traffic.gantry_only());
}

#[test]
fn workload_names_round_trip() {
    for k in Kind::ALL {
        assert_eq!(Kind::parse(k.name()), Some(k));
    }
    assert_eq!(Kind::parse("nope"), None);
    assert!(!text(&workload(Kind::Prose).request(0, 1, 0), 0).is_empty());
}
