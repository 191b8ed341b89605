//! Locks and semaphores (`POST /api/v1/locks`): leases with owners and fencing tokens, and the
//! guard that fences a transaction.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, TokensFile};
use crate::kv::until;

/// One call; insists on a 200 with one result per operation.
async fn locks(app: &TestApp, operations: Value) -> Vec<Value> {
    let count = operations.as_array().map_or(0, Vec::len);
    let answer = app.post("/api/v1/locks", &json!({ "operations": operations })).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let results = answer.body["results"].as_array().cloned().unwrap_or_else(|| panic!("results: {answer:?}"));
    assert_eq!(results.len(), count, "{answer:?}");
    results
}

async fn one(app: &TestApp, operation: Value) -> Value {
    locks(app, json!([operation])).await.remove(0)
}

fn acquire(name: &str, owner: &str, ttl: i64) -> Value {
    json!({"op": "acquire", "name": name, "owner": owner, "ttlSeconds": ttl})
}

fn token(result: &Value) -> i64 {
    result["token"].as_i64().unwrap_or_else(|| panic!("a token: {result}"))
}

#[actix_web::test]
async fn a_lock_has_one_holder_whose_token_changes_at_every_renew_and_only_rises() {
    let app = TestApp::spawn().await;
    let first = one(&app, acquire("report", "alice", 30)).await;
    assert_eq!(
        (first["acquired"].clone(), first["slot"].clone(), first["owner"].clone()),
        (json!(true), json!(0), json!("alice"))
    );
    let t1 = token(&first);
    assert_eq!(
        first["guard"],
        json!({"op": "check", "ns": "queen-locks", "key": "report#0", "expect": t1, "required": true}),
        "the guard checks the permit's row at its token"
    );
    let expires = async || {
        let state = one(&app, json!({"op": "get", "name": "report"})).await;
        let at = state["holders"][0]["expiresAt"].as_str().unwrap_or_else(|| panic!("expiresAt: {state}")).to_owned();
        chrono::DateTime::parse_from_rfc3339(&at).expect("a time")
    };
    let first_expiry = expires().await;
    let again = one(&app, acquire("report", "alice", 600)).await;
    assert_eq!(
        (again["acquired"].clone(), again["already"].clone(), token(&again)),
        (json!(true), json!(true), t1),
        "idempotent"
    );
    // The holder counts the permit's time from its last send: the permit is kept that long.
    let kept_until = expires().await;
    assert!(kept_until - first_expiry > chrono::TimeDelta::seconds(500), "{first_expiry} then {kept_until}");
    let other = one(&app, acquire("report", "bob", 30)).await;
    assert_eq!((other["acquired"].clone(), other["reason"].clone()), (json!(false), json!("held")));
    assert_eq!(other["holders"][0]["owner"], "alice");
    assert_eq!(other["holders"][0]["token"], t1);

    let renewed =
        one(&app, json!({"op": "renew", "name": "report", "token": t1, "ttlSeconds": 30, "slot": 0, "owner": "alice"}))
            .await;
    assert_eq!(renewed["renewed"], true, "{renewed}");
    let t2 = token(&renewed);
    assert!(t2 > t1, "a renew changes the token upwards ({t1} then {t2})");
    assert_eq!(renewed["guard"]["expect"], t2);
    let stale = one(&app, json!({"op": "renew", "name": "report", "token": t1, "ttlSeconds": 30})).await;
    assert_eq!((stale["renewed"].clone(), stale["reason"].clone()), (json!(false), json!("lost")));
    assert_eq!(stale["holders"][0]["token"], t2);
    // Sent again naming its owner, as the client retries a renew whose answer it lost, the renew is
    // the holder's: it renews again, the token moving on, rather than answering lost.
    let repeat = json!({"op": "renew", "name": "report", "token": t1, "ttlSeconds": 30, "slot": 0, "owner": "alice"});
    let repeated = one(&app, repeat.clone()).await;
    assert_eq!(repeated["renewed"], true, "{repeated}");
    let t2 = token(&repeated);
    assert!(t2 > token(&renewed), "still only rising");
    let mut bobs = repeat;
    bobs["owner"] = json!("bob");
    assert_eq!(one(&app, bobs).await["renewed"], false, "another owner's is no repeat");
    let wrong_owner =
        one(&app, json!({"op": "renew", "name": "report", "token": t2, "ttlSeconds": 30, "owner": "bob"})).await;
    assert_eq!(wrong_owner["renewed"], false);

    let state = one(&app, json!({"op": "get", "name": "report"})).await;
    assert_eq!(state["held"], true);
    let holder = &state["holders"][0];
    assert_eq!(
        (holder["slot"].clone(), holder["owner"].clone(), holder["token"].clone()),
        (json!(0), json!("alice"), json!(t2))
    );
    for field in ["since", "expiresAt", "renewedAt"] {
        assert!(holder[field].is_string(), "{field}: {holder}");
    }

    let results = locks(
        &app,
        json!([{"op": "release", "name": "report", "token": t1}, {"op": "release", "name": "report", "token": t2}]),
    )
    .await;
    assert_eq!(results, [json!({"released": false, "reason": "lost"}), json!({"released": true})]);
    assert_eq!(one(&app, json!({"op": "get", "name": "report"})).await, json!({"held": false, "holders": []}));

    let next = one(&app, acquire("report", "bob", 30)).await;
    assert_eq!(next["acquired"], true);
    assert!(token(&next) > t2, "tokens rise across a release and a new holder");
    let earlier = json!({"op": "renew", "name": "report", "token": t2, "ttlSeconds": 30, "owner": "bob"});
    assert_eq!(one(&app, earlier).await["renewed"], false, "a token of an earlier holding is none of this one's");
    let minted = one(&app, json!({"op": "acquire", "name": "unnamed-owner", "ttlSeconds": 5})).await;
    assert!(minted["owner"].as_str().is_some_and(|owner| !owner.is_empty()), "the broker names an owner: {minted}");
}

#[actix_web::test]
async fn a_semaphore_hands_out_its_slots_and_no_more() {
    let app = TestApp::spawn().await;
    let take = |owner: &str| json!({"op": "acquire", "name": "pool", "owner": owner, "ttlSeconds": 30, "limit": 3});
    let results = locks(&app, json!([take("a"), take("b"), take("c"), take("d")])).await;
    let slots: Vec<Value> = results[..3].iter().map(|r| r["slot"].clone()).collect();
    assert_eq!(slots, [json!(0), json!(1), json!(2)]);
    assert_eq!(
        (results[3]["acquired"].clone(), results[3]["holders"].as_array().map(Vec::len)),
        (json!(false), Some(3))
    );
    let tokens: Vec<i64> = results[..3].iter().map(token).collect();
    assert!(tokens.is_sorted() && tokens[0] < tokens[1] && tokens[1] < tokens[2], "the lock's tokens rise: {tokens:?}");
    let b = &results[1];
    let released = one(&app, json!({"op": "release", "name": "pool", "token": token(b), "slot": 1})).await;
    assert_eq!(released["released"], true);
    let d = one(&app, take("d")).await;
    assert_eq!((d["acquired"].clone(), d["slot"].clone()), (json!(true), json!(1)));
    assert!(token(&d) > tokens[2], "above every token the lock handed out, in any slot");
    assert_eq!(d["guard"]["key"], "pool#1");
    let a = &results[0];
    let renewed =
        one(&app, json!({"op": "renew", "name": "pool", "token": token(a), "ttlSeconds": 30, "slot": 0, "owner": "a"}))
            .await;
    assert!(token(&renewed) > token(&d), "a renew of slot 0 rises above slot 1's latest: {renewed}");
}

#[actix_web::test]
async fn an_expired_permit_is_free_and_its_holder_cannot_renew_it() {
    let app = TestApp::spawn().await;
    let first = one(&app, acquire("brief", "alice", 1)).await;
    let polled = &app;
    until(Duration::from_secs(5), "the permit's expiry", move || async move {
        one(polled, json!({"op": "get", "name": "brief"})).await["held"] == false
    })
    .await;
    let late = one(&app, json!({"op": "renew", "name": "brief", "token": token(&first), "ttlSeconds": 30})).await;
    assert_eq!(late["renewed"], false, "an expired permit is lost: {late}");
    let next = one(&app, acquire("brief", "bob", 30)).await;
    assert_eq!(next["acquired"], true);
    assert!(token(&next) > token(&first));
    let release = one(&app, json!({"op": "release", "name": "brief", "token": token(&first)})).await;
    assert_eq!(release["released"], false, "the old token releases nothing");
    assert_eq!(one(&app, json!({"op": "get", "name": "brief"})).await["holders"][0]["owner"], "bob");
}

/// An acquire sent again finds its owner's permit live when it lists the holders, and the
/// permit runs out before the acquire gets its row (held here by the test's session until it
/// has). It is then no permit of the owner's: the acquire takes the slot anew with a new token,
/// rather than answering the old one `already` while nobody holds the lock, and another owner's
/// acquire is refused.
#[actix_web::test]
async fn an_acquire_repeated_as_its_permit_runs_out_takes_it_anew() {
    let app = TestApp::spawn().await;
    let first = one(&app, acquire("lapsing", "alice", 1)).await;
    let holder = app.db.connect().await;
    holder.batch_execute("BEGIN").await.expect("a transaction");
    let row = "SELECT 1 FROM queen.kv WHERE ns = 'queen-locks' AND key = 'lapsing#0' FOR UPDATE";
    assert_eq!(holder.execute(row, &[]).await.expect("the permit's row"), 1);
    let repeated = async { one(&app, acquire("lapsing", "alice", 30)).await };
    let releasing = async {
        app.until_waiting_for_a_lock("queen.kv", "the repeated acquire waits for the permit's row").await;
        let lapsed =
            "SELECT count(*) FROM queen.kv WHERE ns = 'queen-locks' AND key = 'lapsing#0' AND expires_at <= now()";
        let polled = &app;
        until(Duration::from_secs(5), "the permit's expiry", move || async move { polled.count(lapsed).await == 1 })
            .await;
        holder.batch_execute("COMMIT").await.expect("the row let go");
    };
    let (again, ()) = futures::join!(repeated, releasing);
    assert_eq!((&again["acquired"], &again["already"]), (&json!(true), &json!(false)), "{again}");
    assert!(token(&again) > token(&first), "a new token: {again}");
    let state = one(&app, json!({"op": "get", "name": "lapsing"})).await;
    assert_eq!((&state["held"], &state["holders"][0]["owner"]), (&json!(true), &json!("alice")), "{state}");
    assert_eq!(one(&app, acquire("lapsing", "bob", 30)).await["acquired"], false, "one holder");
}

/// Maintenance removes a released permit's row; the next token is still above every earlier one.
#[actix_web::test]
async fn tokens_keep_rising_after_maintenance_removed_the_permit() {
    let app = TestApp::spawn_with(|config| config.maintenance.interval_ms = 100).await;
    let mut last = 0;
    for round in 0..3 {
        let held = one(&app, acquire("cycle", &format!("owner-{round}"), 30)).await;
        let t = token(&held);
        assert!(t > last, "round {round}: {t} after {last}");
        let renewed = one(&app, json!({"op": "renew", "name": "cycle", "token": t, "ttlSeconds": 30})).await;
        last = token(&renewed);
        assert_eq!(one(&app, json!({"op": "release", "name": "cycle", "token": last})).await["released"], true);
        let polled = &app;
        until(Duration::from_secs(20), "the removal of the released permit", move || async move {
            polled.count("SELECT count(*) FROM queen.kv WHERE ns = 'queen-locks'").await == 0
        })
        .await;
    }
}

#[actix_web::test]
async fn bad_lock_operations_are_refused_naming_the_field() {
    let app = TestApp::spawn().await;
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"op": "acquire", "name": "a#b", "ttlSeconds": 5}), "lock_invalid_field", "operations[0].name"),
        (json!({"op": "acquire", "name": "", "ttlSeconds": 5}), "lock_invalid_field", "operations[0].name"),
        (
            json!({"op": "acquire", "name": "x".repeat(257), "ttlSeconds": 5}),
            "lock_invalid_field",
            "operations[0].name",
        ),
        (json!({"op": "acquire", "name": "a\nb", "ttlSeconds": 5}), "lock_invalid_field", "operations[0].name"),
        (json!({"op": "acquire", "name": "a"}), "lock_invalid_field", "operations[0].ttlSeconds"),
        (json!({"op": "acquire", "name": "a", "ttlSeconds": 0}), "lock_invalid_field", "operations[0].ttlSeconds"),
        (
            json!({"op": "acquire", "name": "a", "ttlSeconds": 5, "limit": 1025}),
            "lock_invalid_field",
            "operations[0].limit",
        ),
        (
            json!({"op": "acquire", "name": "a", "ttlSeconds": 5, "owner": ""}),
            "lock_invalid_field",
            "operations[0].owner",
        ),
        (
            json!({"op": "acquire", "name": "a", "ttlSeconds": 5, "forever": true}),
            "lock_unknown_field",
            "operations[0].forever",
        ),
        (json!({"op": "renew", "name": "a", "ttlSeconds": 5}), "lock_invalid_field", "operations[0].token"),
        (json!({"op": "renew", "name": "a", "token": 0, "ttlSeconds": 5}), "lock_invalid_field", "operations[0].token"),
        (json!({"op": "release", "name": "a", "token": 3, "slot": -1}), "lock_invalid_field", "operations[0].slot"),
        (json!({"op": "steal", "name": "a"}), "lock_unknown_op", "operations[0].op"),
    ];
    for (bad, code, field) in cases {
        let answer = app.post("/api/v1/locks", &json!({"operations": [bad]})).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{bad}: {answer:?}");
        assert_eq!(
            (answer.body["error"].as_str(), answer.body["reason"].as_str()),
            (Some(code), Some(field)),
            "{bad}: {answer:?}"
        );
    }
    let answer = app.post("/api/v1/locks", &json!({"operations": []})).await;
    assert_eq!((answer.status, answer.body["error"].as_str()), (StatusCode::BAD_REQUEST, Some("lock_invalid_body")));
    assert_eq!(app.count("SELECT count(*) FROM queen.kv").await, 0, "nothing was written");
}

#[actix_web::test]
async fn a_guard_commits_a_step_only_while_the_permit_is_its_holders() {
    let app = TestApp::spawn().await;
    let held = one(&app, acquire("step", "alice", 30)).await;
    let push = |id: &str| json!({"type": "push", "items": [{"queue": "guarded", "transactionId": id, "payload": id}]});
    let committed = app.post("/api/v1/transaction", &json!({"operations": [push("m1")], "kv": [held["guard"]]})).await;
    assert_eq!(committed.body["success"], true, "{committed:?}");
    assert_eq!(committed.body["results"][1]["applied"], true, "the guard's result follows the pushed item");

    let renewed = one(&app, json!({"op": "renew", "name": "step", "token": token(&held), "ttlSeconds": 30})).await;
    let stale = app.post("/api/v1/transaction", &json!({"operations": [push("m2")], "kv": [held["guard"]]})).await;
    assert_eq!(stale.status, StatusCode::OK);
    assert_eq!(
        (stale.body["success"].clone(), stale.body["reason"].clone(), stale.body["failedIndex"].clone()),
        (json!(false), json!("kv_precondition"), json!(1))
    );
    assert_eq!(
        (stale.body["kvReason"].clone(), stale.body["value"]["owner"].clone()),
        (json!("version"), json!("alice"))
    );
    assert_eq!(stale.body["version"], renewed["token"], "the row's current token");
    let current = app.post("/api/v1/transaction", &json!({"operations": [push("m3")], "kv": [renewed["guard"]]})).await;
    assert_eq!(current.body["success"], true, "{current:?}");

    one(&app, json!({"op": "release", "name": "step", "token": token(&renewed)})).await;
    let released =
        app.post("/api/v1/transaction", &json!({"operations": [push("m4")], "kv": [renewed["guard"]]})).await;
    assert_eq!((released.body["success"].clone(), released.body["kvReason"].clone()), (json!(false), json!("absent")));
    let delivered = app.pop("queue/guarded", "batch=10").await;
    let ids: Vec<Value> = delivered.messages().iter().map(|m| m["data"].clone()).collect();
    assert_eq!(ids, [json!("m1"), json!("m3")], "only the steps under a live guard were pushed");
}

/// With auth on, a permit is bound to the identity that took it: a token is no secret (every
/// holder is listed with it), so another client knowing it, and the owner's name, can neither
/// take the permit as its own, renew it nor release it. The holder still can.
#[actix_web::test]
async fn another_identity_cannot_take_renew_or_release_a_held_permit() {
    const ALICE: &str = "alice-token-0123456789abcdef";
    const MALLORY: &str = "mallory-token-0123456789abcdef";
    let tokens = TokensFile::new(&format!(
        "[[token]]\nname = \"alice\"\ntoken = \"{ALICE}\"\nrole = \"read-write\"\n\
         [[token]]\nname = \"mallory\"\ntoken = \"{MALLORY}\"\nrole = \"read-write\"\n"
    ));
    let file = tokens.path();
    let app = TestApp::spawn_with(move |config| config.auth.tokens_file = Some(file)).await;
    let call = |token: &'static str, operation: Value| {
        let request =
            app.http.post(app.url("/api/v1/locks")).bearer_auth(token).json(&json!({"operations": [operation]}));
        async move {
            let answer = request.send().await.expect("a call");
            assert_eq!(answer.status(), StatusCode::OK);
            answer.json::<Value>().await.expect("JSON")["results"][0].clone()
        }
    };

    let held = call(ALICE, acquire("report", "alice-worker", 30)).await;
    assert_eq!(held["acquired"], true, "{held}");
    let listed = call(MALLORY, json!({"op": "get", "name": "report"})).await;
    assert_eq!(listed["holders"][0]["token"], held["token"], "the token is listed: {listed}");

    let posing = call(MALLORY, acquire("report", "alice-worker", 30)).await;
    assert_eq!((&posing["acquired"], &posing["reason"]), (&json!(false), &json!("held")), "{posing}");
    let renew =
        json!({"op": "renew", "name": "report", "token": held["token"], "ttlSeconds": 30, "owner": "alice-worker"});
    let renewed = call(MALLORY, renew.clone()).await;
    assert_eq!(renewed["renewed"], false, "{renewed}");
    let release = json!({"op": "release", "name": "report", "token": held["token"]});
    let released = call(MALLORY, release.clone()).await;
    assert_eq!(released["released"], false, "{released}");
    let still = call(ALICE, json!({"op": "get", "name": "report"})).await;
    assert_eq!(still["holders"][0]["token"], held["token"], "still alice's, unchanged: {still}");

    let again = call(ALICE, acquire("report", "alice-worker", 30)).await;
    assert_eq!((&again["acquired"], &again["already"]), (&json!(true), &json!(true)), "{again}");
    assert_eq!(call(ALICE, release).await["released"], true);

    // On a semaphore, a permit taken under alice's owner name by another identity is not hers,
    // and does not lock her out of the free slot.
    let semaphore = json!({"op": "acquire", "name": "pool", "owner": "alice-worker", "ttlSeconds": 30, "limit": 2});
    let squatted = call(MALLORY, semaphore.clone()).await;
    assert_eq!((&squatted["acquired"], &squatted["slot"]), (&json!(true), &json!(0)), "{squatted}");
    let hers = call(ALICE, semaphore).await;
    let taken = (&hers["acquired"], &hers["already"], &hers["slot"]);
    assert_eq!(taken, (&json!(true), &json!(false), &json!(1)), "{hers}");
}
