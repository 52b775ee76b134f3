//! The accounts store on SQLite and, where `GANTRY_TEST_DATABASE_URL` names one, PostgreSQL (the
//! `on_both!` macro): keys created, authenticated, revoked and stored hashed; the database opened,
//! shared and migrated durably.

use std::collections::HashSet;

use super::*;

/// Runs a test body against SQLite and, when `GANTRY_TEST_DATABASE_URL` names a server, against
/// a fresh PostgreSQL database too: one suite for both backends.
macro_rules! on_both {
    ($name:ident, $body:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn sqlite() {
                let (_dir, acc) = open_tmp().await;
                ($body)(acc).await
            }

            #[tokio::test]
            async fn postgres() {
                let Some(acc) = open_postgres(concat!(module_path!(), "::postgres")).await else { return };
                ($body)(acc).await
            }
        }
    };
}

/// `None` (after a printed skip line) only when PostgreSQL is not required; see
/// [`crate::testing::postgres_admin_url_for`].
async fn open_postgres(test: &str) -> Option<Accounts> {
    let admin = crate::testing::postgres_admin_url_for(test)?;
    let url = crate::testing::fresh_postgres_database(&admin).await.expect("create a test database");
    Some(Accounts::open_url(&url).await.expect("open PostgreSQL"))
}

mod batches;
mod budget;
mod cache_scope;
mod metering;
mod stored_responses;
mod tenants;
mod unknown_keys;
mod usage;

async fn open_tmp() -> (tempfile::TempDir, Accounts) {
    let dir = tempfile::tempdir().unwrap();
    let accounts = Accounts::open_data_dir(dir.path()).await.unwrap();
    (dir, accounts)
}

#[tokio::test]
async fn create_then_authenticate() {
    let (dir, acc) = open_tmp().await;
    assert!(dir.path().join(DB_FILE_NAME).is_file());
    let created = acc.create_key("alice").await.unwrap();
    assert_eq!(created.key.name, "alice");
    assert_eq!(created.key.prefix, &created.secret[..DISPLAY_PREFIX_LEN]);
    assert!(created.key.prefix.starts_with(SECRET_PREFIX));
    assert!(created.key.created_at > 1_600_000_000);
    assert_eq!(created.key.revoked_at, None);
    assert!(!format!("{created:?}").contains(&created.secret), "Debug leaks the secret");

    let auth = acc.authenticate(&created.secret).await.unwrap();
    assert_eq!(auth, Some(created.key.clone()));
    assert_eq!(acc.list_keys().await.unwrap(), vec![created.key]);
    assert_eq!(acc.count_active_keys().await.unwrap(), 1);
}

on_both!(wrong_secret_is_rejected, |acc: Accounts| async move {
    let created = acc.create_key("alice").await.unwrap();
    let mut wrong = created.secret.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'a' { 'b' } else { 'a' });
    assert_eq!(acc.authenticate(&wrong).await.unwrap(), None);
    assert_eq!(acc.authenticate(&generate_secret()).await.unwrap(), None);
    assert_eq!(acc.authenticate("").await.unwrap(), None);
    assert_eq!(acc.authenticate(&created.key.prefix).await.unwrap(), None);
    assert_eq!(acc.authenticate(&format!("{} ", created.secret)).await.unwrap(), None);
    assert!(acc.authenticate(&created.secret).await.unwrap().is_some());
});

on_both!(revoke_disables_key, |acc: Accounts| async move {
    let a = acc.create_key("alice").await.unwrap();
    let b = acc.create_key("bob").await.unwrap();
    let c = acc.create_key("carol").await.unwrap();

    let revoked = acc.revoke_key("alice").await.unwrap();
    assert_eq!(revoked.id, a.key.id);
    assert!(revoked.revoked_at.is_some());
    assert_eq!(acc.authenticate(&a.secret).await.unwrap(), None);
    assert!(acc.authenticate(&b.secret).await.unwrap().is_some());
    assert_eq!(acc.count_active_keys().await.unwrap(), 2);

    // By numeric id and by display prefix.
    assert_eq!(acc.revoke_key(&b.key.id.to_string()).await.unwrap().id, b.key.id);
    assert_eq!(acc.revoke_key(&c.key.prefix).await.unwrap().id, c.key.id);
    assert_eq!(acc.authenticate(&b.secret).await.unwrap(), None);
    assert_eq!(acc.authenticate(&c.secret).await.unwrap(), None);
    assert_eq!(acc.count_active_keys().await.unwrap(), 0);

    // Revoking again is a no-op that keeps the original timestamp.
    let again = acc.revoke_key("alice").await.unwrap();
    assert_eq!(again.revoked_at, revoked.revoked_at);

    assert!(matches!(acc.revoke_key("nobody").await, Err(AccountsError::NotFound(_))));
    assert!(matches!(acc.revoke_key("999").await, Err(AccountsError::NotFound(_))));
});

on_both!(revoke_by_name_requires_unique_active_name, |acc: Accounts| async move {
    let first = acc.create_key("ci").await.unwrap();
    let second = acc.create_key("ci").await.unwrap();
    assert!(matches!(acc.revoke_key("ci").await, Err(AccountsError::Ambiguous(_))));
    assert_eq!(acc.count_active_keys().await.unwrap(), 2);

    acc.revoke_key(&first.key.id.to_string()).await.unwrap();
    // Only one active "ci" remains, so the name now resolves to it.
    assert_eq!(acc.revoke_key("ci").await.unwrap().id, second.key.id);
    assert_eq!(acc.count_active_keys().await.unwrap(), 0);
});

on_both!(a_name_of_digits_alone_is_refused_as_it_reads_as_an_id, |acc: Accounts| async move {
    let other = acc.create_key("other").await.unwrap();
    for name in ["2", " 17 ", &other.key.id.to_string()] {
        assert!(matches!(acc.create_key(name).await, Err(AccountsError::Invalid(_))), "{name:?}");
    }
    let rename = KeyUpdate { name: Some("42".into()), ..Default::default() };
    assert!(acc.update_key(&other.key.id.to_string(), &rename).await.is_err());
    assert!(acc.create_key("v2").await.is_ok(), "digits beside letters are a name");
});

on_both!(a_name_never_shadows_another_keys_prefix, |acc: Accounts| async move {
    let leaked = acc.create_key("leaky").await.unwrap();
    let decoy = acc.create_key(&leaked.key.prefix).await;
    assert!(matches!(decoy, Err(AccountsError::Invalid(_))), "{decoy:?}");
    // A key registered with a secret of its own has a prefix any name could spell: one value
    // naming two keys is ambiguous rather than the name's key.
    let custom = acc.ensure_key("custom-secret-0123456789abcdefghij", "ops").await.unwrap();
    acc.create_key(&custom.prefix).await.unwrap();
    assert!(matches!(acc.revoke_key(&custom.prefix).await, Err(AccountsError::Ambiguous(_))));
    assert_eq!(acc.revoke_key(&leaked.key.prefix).await.unwrap().id, leaked.key.id);
});

on_both!(revoke_by_pasted_secret_does_not_echo_it, |acc: Accounts| async move {
    let k = acc.create_key("alice").await.unwrap();
    assert_eq!(acc.revoke_key(&k.secret).await.unwrap().id, k.key.id);
    let other = generate_secret();
    let err = acc.revoke_key(&other).await.unwrap_err();
    assert!(matches!(err, AccountsError::NotFound(_)));
    assert!(!err.to_string().contains(&other));
});

on_both!(ensure_key_is_idempotent, |acc: Accounts| async move {
    let secret = "my-operator-provided-key-123456";
    let first = acc.ensure_key(secret, "default").await.unwrap();
    let second = acc.ensure_key(secret, "renamed").await.unwrap();
    assert_eq!(first, second);
    assert_eq!(second.name, "default");
    assert_eq!(acc.list_keys().await.unwrap().len(), 1);
    assert_eq!(acc.authenticate(secret).await.unwrap(), Some(first.clone()));
    // A short caller key never shows more than half of itself.
    assert!(first.prefix.len() <= secret.len() / 2);
    assert!(secret.starts_with(&first.prefix));

    acc.revoke_key(&first.id.to_string()).await.unwrap();
    assert!(matches!(acc.ensure_key(secret, "default").await, Err(AccountsError::KeyRevoked)));
    assert_eq!(acc.authenticate(secret).await.unwrap(), None, "ensure_key must not reactivate");
    assert_eq!(acc.count_active_keys().await.unwrap(), 0);

    assert!(matches!(acc.ensure_key("short", "x").await, Err(AccountsError::Invalid(_))));
    assert!(matches!(acc.ensure_key(&generate_secret(), "  ").await, Err(AccountsError::Invalid(_))));
    assert_eq!(acc.list_keys().await.unwrap().len(), 1);
});

#[tokio::test]
async fn secrets_are_stored_hashed() {
    let (dir, acc) = open_tmp().await;
    let created = acc.create_key("alice").await.unwrap();
    let provided = "operator-key-abcdefghijklmnopqrstuvwxyz";
    acc.ensure_key(provided, "op").await.unwrap();

    let rows: Vec<(i64, String, String, String, i64, Option<i64>)> =
        sqlx::query_as("SELECT id, name, prefix, secret_hash, created_at, revoked_at FROM api_keys")
            .fetch_all(&acc.pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), 2);
    for (_, _, prefix, hash, _, _) in &rows {
        assert_eq!(hash.len(), 64);
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()));
        for secret in [created.secret.as_str(), provided] {
            assert_ne!(prefix, secret);
            assert!(!hash.contains(secret));
        }
    }
    assert!(rows.iter().any(|r| r.3 == keys::hash_secret(&created.secret)));

    // Nothing on disk (main file or WAL) contains a plaintext secret.
    acc.close().await;
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        for secret in [created.secret.as_bytes(), provided.as_bytes()] {
            assert!(!bytes.windows(secret.len()).any(|w| w == secret), "plaintext on disk");
        }
    }
}

#[tokio::test]
async fn two_handles_on_one_data_dir_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let server = Accounts::open_data_dir(dir.path()).await.unwrap();
    let cli = Accounts::open_data_dir(dir.path()).await.unwrap();

    // Warm the server's pool so it has open connections before the CLI writes.
    assert_eq!(server.count_active_keys().await.unwrap(), 0);
    let k = cli.create_key("from-cli").await.unwrap();
    assert_eq!(server.authenticate(&k.secret).await.unwrap(), Some(k.key.clone()));
    assert_eq!(server.count_active_keys().await.unwrap(), 1);

    let s = server.create_key("from-server").await.unwrap();
    assert!(cli.authenticate(&s.secret).await.unwrap().is_some());

    cli.revoke_key("from-cli").await.unwrap();
    assert_eq!(server.authenticate(&k.secret).await.unwrap(), None);
    assert_eq!(server.list_keys().await.unwrap().len(), 2);
}

#[test]
fn generated_secrets_have_format_and_entropy() {
    let mut seen = HashSet::new();
    let mut chars = HashSet::new();
    for _ in 0..1000 {
        let s = generate_secret();
        assert!(s.starts_with(SECRET_PREFIX));
        let random = &s[SECRET_PREFIX.len()..];
        assert_eq!(random.len(), 40);
        assert!(random.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert!(looks_like_key(&s));
        chars.extend(random.chars());
        assert!(seen.insert(s), "duplicate secret");
    }
    // 40,000 draws from 62 symbols: every symbol should show up.
    assert_eq!(chars.len(), 62);
}

#[test]
fn looks_like_key_rules() {
    assert!(looks_like_key(&"a".repeat(20)));
    assert!(looks_like_key(&"a".repeat(200)));
    assert!(!looks_like_key(&"a".repeat(19)));
    assert!(!looks_like_key(&"a".repeat(201)));
    assert!(!looks_like_key("sk-gantry-abc def ghijklmnop"));
    assert!(!looks_like_key("sk-gantry-abcdefghijklmnop\n"));
    assert!(!looks_like_key("sk-gantry-abcdéfghijklmnop"));
    assert!(looks_like_key("sk-gantry-!#$%&'()*+,-./:;<=>?@[]^_`{|}~"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let a = Accounts::open_data_dir(dir.path()).await.unwrap();
    let b = Accounts::open_data_dir(dir.path()).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let acc = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move { acc.create_key(&format!("k{i}")).await }));
    }
    let mut ids = HashSet::new();
    let mut secrets = Vec::new();
    for t in tasks {
        let created = t.await.unwrap().unwrap();
        assert!(ids.insert(created.key.id));
        secrets.push(created.secret);
    }
    assert_eq!(a.count_active_keys().await.unwrap(), 32);
    assert_eq!(b.list_keys().await.unwrap().len(), 32);
    for s in &secrets {
        assert!(a.authenticate(s).await.unwrap().is_some());
    }
}

#[tokio::test]
async fn memory_url_shares_one_database() {
    let acc = Accounts::open_url("sqlite::memory:").await.unwrap();
    let k = acc.create_key("mem").await.unwrap();
    let clone = acc.clone();
    let (x, y) = tokio::join!(acc.authenticate(&k.secret), clone.list_keys());
    assert_eq!(x.unwrap(), Some(k.key.clone()));
    assert_eq!(y.unwrap(), vec![k.key]);
}

#[tokio::test]
async fn file_url_creates_parent_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/deeper/g.db");
    let url = format!("sqlite://{}", path.display());
    let acc = Accounts::open_url(&url).await.unwrap();
    let k = acc.create_key("x").await.unwrap();
    assert!(path.is_file());
    let other = Accounts::open_url(&url).await.unwrap();
    assert!(other.authenticate(&k.secret).await.unwrap().is_some());
}

#[tokio::test]
async fn reopening_keeps_data_and_skips_applied_migrations() {
    let dir = tempfile::tempdir().unwrap();
    let secret = {
        let acc = Accounts::open_data_dir(dir.path()).await.unwrap();
        let s = acc.create_key("persist").await.unwrap().secret;
        acc.close().await;
        s
    };
    let acc = Accounts::open_data_dir(dir.path()).await.unwrap();
    assert_eq!(acc.authenticate(&secret).await.unwrap().unwrap().name, "persist");
}

#[tokio::test]
async fn data_dir_uses_wal_and_busy_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let acc = Accounts::open_data_dir(&dir.path().join("a/b")).await.unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode").fetch_one(&acc.pool).await.unwrap();
    assert_eq!(mode.to_lowercase(), "wal");
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout").fetch_one(&acc.pool).await.unwrap();
    assert_eq!(busy, 5000);
    let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys").fetch_one(&acc.pool).await.unwrap();
    assert_eq!(fk, 1);
    assert!(dir.path().join("a/b").join(DB_FILE_NAME).is_file());
}

// A commit the database acknowledged must survive its crash: the outbox forgets a usage record
// once it is acknowledged. The test PostgreSQL runs with `synchronous_commit = off`, exactly
// the setting this guards against.
on_both!(every_connection_commits_durably, |acc: Accounts| async move {
    for _ in 0..3 {
        let mut conn = acc.pool.acquire().await.unwrap();
        match acc.backend {
            Backend::Postgres => {
                let level: String = sqlx::query_scalar("SHOW synchronous_commit").fetch_one(&mut *conn).await.unwrap();
                assert_ne!(level, "off");
            }
            Backend::Sqlite => {
                // 2 = FULL: the WAL is synced at every commit.
                let level: i64 = sqlx::query_scalar("PRAGMA synchronous").fetch_one(&mut *conn).await.unwrap();
                assert_eq!(level, 2);
            }
        }
    }
});
