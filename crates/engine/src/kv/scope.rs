//! Which requests may share cached KV entries and compiled grammars: those of one scope.

/// Which requests may reuse one another's cached prompt prefixes (KV entries in slots or host
/// memory, a prompt being prefilled, answers offered as drafts). Reuse is visible to the client
/// (`cached_tokens`, time to first token), so a prefix cached under one scope is never matched
/// from another: a tenant cannot probe another tenant's prompts. The server derives the id from
/// the API key's setting (tenant, key or shared); the default is the one scope of a
/// single-tenant embedding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct CacheScope(pub u64);
