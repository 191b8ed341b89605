//! A JWKS: the public keys of an identity provider, by key id, fetched from `auth.jwt_jwks_url`
//! and kept fresh in the background. A token whose `kid` is not held asks for a fetch at once (at
//! most every `auth.jwt_jwks_min_refetch_seconds`), so a key rotation is picked up without a
//! restart and without waiting for the next refresh. Every fetch happens in one task, on the
//! runtime that started it (an HTTP client is not shared across the HTTP workers' runtimes).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::{mpsc, oneshot};

/// A key the set holds.
pub struct PublicKey {
    pub algorithm: Algorithm,
    pub key: DecodingKey,
}

/// Requests for a fetch, each answered when the set has been fetched (or found fresh enough).
type RefetchRequest = oneshot::Sender<()>;

/// The keys of one fetch, by key id.
type Keys = Arc<HashMap<String, Arc<PublicKey>>>;

pub struct KeySet {
    url: String,
    timeout: Duration,
    refresh: Duration,
    min_refetch: Duration,
    keys: RwLock<Option<Keys>>,
    requests: mpsc::Sender<RefetchRequest>,
    /// Taken by [`keep_fresh`].
    pending: std::sync::Mutex<Option<mpsc::Receiver<RefetchRequest>>>,
}

/// How long a request for a key waits for a fetch it asked for.
const REFETCH_WAIT: Duration = Duration::from_secs(10);

impl KeySet {
    pub fn new(url: String, timeout: Duration, refresh: Duration, min_refetch: Duration) -> Arc<Self> {
        let (requests, pending) = mpsc::channel(64);
        Arc::new(Self {
            url,
            timeout,
            refresh,
            min_refetch,
            keys: RwLock::new(None),
            requests,
            pending: std::sync::Mutex::new(Some(pending)),
        })
    }

    /// Whether any fetch has succeeded yet.
    pub fn is_loaded(&self) -> bool {
        self.keys.read().is_ok_and(|keys| keys.is_some())
    }

    fn held(&self) -> Option<Keys> {
        self.keys.read().ok().and_then(|keys| keys.clone())
    }

    /// The key named `kid` (or, for a token without one, the set's only key of the algorithm),
    /// fetching the set again when it is not held.
    pub async fn find(&self, kid: Option<&str>, algorithm: Algorithm) -> Option<Arc<PublicKey>> {
        if let Some(key) = self.held().and_then(|keys| pick(&keys, kid, algorithm)) {
            return Some(key);
        }
        let (answer, answered) = oneshot::channel();
        if self.requests.try_send(answer).is_ok() {
            let _ = tokio::time::timeout(REFETCH_WAIT, answered).await;
        }
        self.held().and_then(|keys| pick(&keys, kid, algorithm))
    }

    async fn fetch(&self, client: &reqwest::Client) -> Result<usize, String> {
        let response = client.get(&self.url).send().await.map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        let set: JwkSet = response.json().await.map_err(|e| format!("not a JWKS: {e}"))?;
        let keys = keys_of(&set);
        let count = keys.len();
        if let Ok(mut held) = self.keys.write() {
            *held = Some(Arc::new(keys));
        }
        Ok(count)
    }
}

fn pick(keys: &HashMap<String, Arc<PublicKey>>, kid: Option<&str>, algorithm: Algorithm) -> Option<Arc<PublicKey>> {
    let key = match kid {
        Some(kid) => keys.get(kid)?,
        None => {
            let mut of_algorithm = keys.values().filter(|key| key.algorithm == algorithm);
            let only = of_algorithm.next()?;
            if of_algorithm.next().is_some() {
                return None;
            }
            only
        }
    };
    (key.algorithm == algorithm).then(|| Arc::clone(key))
}

/// The signing keys of a JWKS this broker can use: RSA keys for RS256 and Ed25519 keys for
/// EdDSA, each with a key id. Symmetric keys are never taken from a JWKS (a published secret
/// would let anyone sign), nor are encryption keys.
fn keys_of(set: &JwkSet) -> HashMap<String, Arc<PublicKey>> {
    let mut keys = HashMap::new();
    for jwk in &set.keys {
        let Some(kid) = &jwk.common.key_id else { continue };
        if matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption)) {
            continue;
        }
        let algorithm = match &jwk.algorithm {
            AlgorithmParameters::RSA(_) => Algorithm::RS256,
            AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
            _ => continue,
        };
        match DecodingKey::from_jwk(jwk) {
            Ok(key) => {
                keys.insert(kid.clone(), Arc::new(PublicKey { algorithm, key }));
            }
            Err(e) => tracing::warn!(kid, error = %e, "skipping a JWKS key that cannot be read"),
        }
    }
    keys
}

/// Fetches the set now, again every `refresh`, and whenever a token asks for a key it does not
/// hold (at most every `min_refetch`). Runs for the life of the broker.
pub async fn keep_fresh(set: Arc<KeySet>) {
    let Some(mut requests) = set.pending.lock().ok().and_then(|mut pending| pending.take()) else {
        return;
    };
    queen_store::tls::install_crypto_provider();
    let client = match reqwest::Client::builder().timeout(set.timeout).build() {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the JWKS client; JWTs cannot be verified");
            return;
        }
    };
    let mut fetched_at: Option<Instant> = None;
    let mut next = tokio::time::Instant::now();
    loop {
        let waiting = tokio::select! {
            () = tokio::time::sleep_until(next) => None,
            request = requests.recv() => match request {
                Some(answer) => Some(answer),
                None => return,
            },
        };
        let recent = fetched_at.is_some_and(|at| at.elapsed() < set.min_refetch);
        if waiting.is_none() || !recent {
            match set.fetch(&client).await {
                Ok(count) => {
                    tracing::info!(url = %set.url, keys = count, "fetched the JWKS");
                    fetched_at = Some(Instant::now());
                    next = tokio::time::Instant::now() + set.refresh;
                }
                Err(e) => {
                    tracing::warn!(url = %set.url, error = %e, "cannot fetch the JWKS; keeping the keys held");
                    // Tried now: the next request waits its turn too, and the schedule retries soon.
                    fetched_at = Some(Instant::now());
                    next = tokio::time::Instant::now() + set.min_refetch.max(Duration::from_secs(1));
                }
            }
        }
        if let Some(answer) = waiting {
            let _ = answer.send(());
        }
        // Answer everyone who asked meanwhile: the set they wanted is the one just fetched.
        while let Ok(answer) = requests.try_recv() {
            let _ = answer.send(());
        }
    }
}
