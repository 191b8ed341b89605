//! Migration 17 on PostgreSQL without Citus: it takes the no-op path. And what its Citus branch
//! does, run here with stand-ins for Citus's two functions that only record their calls: the
//! schema it leaves meets Citus's rules for distributed tables, and the broker works on it.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::helpers::TestApp;

#[actix_web::test]
async fn without_citus_the_distribution_migration_changes_nothing() {
    let app = TestApp::spawn().await;
    let db = app.db.connect().await;
    let citus: i64 =
        db.query_one("SELECT count(*) FROM pg_extension WHERE extname = 'citus'", &[]).await.unwrap().get(0);
    assert_eq!(citus, 0, "this test needs a server without Citus");
    let engine: Value =
        db.query_one("SELECT value FROM queen.system_state WHERE key = 'distribution'", &[]).await.unwrap().get(0);
    assert_eq!(engine, json!({"engine": "postgres"}));
    // What the Citus branch would have removed is all still there.
    for (what, sql) in [
        (
            "the partition name uniqueness",
            "SELECT count(*) FROM pg_constraint WHERE conname = 'partitions_queue_id_name_key'",
        ),
        ("the message id trigger", "SELECT count(*) FROM pg_trigger WHERE tgname = 'partitions_delete_message_ids'"),
    ] {
        assert_eq!(app.count(sql).await, 1, "{what} is gone");
    }
}

/// Stand-ins for Citus's `create_reference_table` and `create_distributed_table`, recording the
/// calls in order.
const CITUS_STAND_INS: &str = "
    CREATE TABLE public.citus_calls (ord serial, kind text NOT NULL, rel regclass NOT NULL, key text, colocate text);
    CREATE FUNCTION public.create_reference_table(rel regclass) RETURNS void LANGUAGE sql
        AS $$ INSERT INTO public.citus_calls (kind, rel) VALUES ('reference', rel) $$;
    CREATE FUNCTION public.create_distributed_table(rel regclass, key text, colocate_with text DEFAULT 'default')
        RETURNS void LANGUAGE sql
        AS $$ INSERT INTO public.citus_calls (kind, rel, key, colocate) VALUES ('distributed', rel, key, colocate_with) $$;";

/// The type of `table`'s column `key`, as Citus compares co-located distribution columns.
async fn key_type(db: &tokio_postgres::Client, table: &str, key: &str) -> String {
    db.query_one(
        "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
          WHERE a.attrelid = $1::text::regclass AND a.attname = $2",
        &[&table, &key],
    )
    .await
    .unwrap_or_else(|e| panic!("{table}.{key}: {e}"))
    .get(0)
}

#[derive(Debug)]
struct Placement {
    order: i32,
    /// The distribution key; `None` for a reference table.
    key: Option<String>,
    colocate: Option<String>,
}

#[actix_web::test]
async fn the_citus_branch_leaves_a_schema_citus_accepts_and_the_broker_works_on_it() {
    let app = TestApp::spawn().await;
    let db = app.db.connect().await;
    db.batch_execute(CITUS_STAND_INS).await.expect("the stand-ins");
    db.batch_execute("SELECT queen.distribute_over_citus()").await.expect("the Citus branch runs on this schema");

    let placements: HashMap<String, Placement> = db
        .query("SELECT rel::text, ord, key, colocate FROM public.citus_calls", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), Placement { order: row.get(1), key: row.get(2), colocate: row.get(3) }))
        .collect();
    let tables: Vec<String> = db
        .query(
            "SELECT c.oid::regclass::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = 'queen' AND c.relkind = 'r' AND c.relname <> 'schema_migrations' ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    for table in &tables {
        assert!(placements.contains_key(table), "{table} is neither distributed nor a reference table");
    }
    assert_eq!(placements.len(), tables.len(), "a table is placed twice: {placements:?}");

    // The co-location group of a distributed table, as Citus forms them.
    let mut groups: HashMap<String, String> = HashMap::new();
    let mut ordered: Vec<(&String, &Placement)> = placements.iter().collect();
    ordered.sort_by_key(|(_, p)| p.order);
    for (table, placement) in &ordered {
        let Some(key) = &placement.key else { continue };
        let group = match placement.colocate.as_deref() {
            Some("none") => (*table).clone(),
            Some("default") | None => format!("default {}", key_type(&db, table, key).await),
            Some(other) => {
                let group =
                    groups.get(other).unwrap_or_else(|| panic!("{table} co-located with {other}, not yet placed"));
                let other_key = placements[other].key.clone().expect("a distributed table");
                assert_eq!(
                    key_type(&db, table, key).await,
                    key_type(&db, other, &other_key).await,
                    "{table} and {other} are co-located on keys of different types"
                );
                group.clone()
            }
        };
        groups.insert((*table).clone(), group);
    }

    // Every primary key and unique constraint of a distributed table holds its key.
    for (table, placement) in &placements {
        let Some(key) = &placement.key else { continue };
        let without_key: Vec<String> = db
            .query(
                "SELECT conname::text FROM pg_constraint
                  WHERE conrelid = $1::text::regclass AND contype IN ('p', 'u')
                    AND NOT (SELECT attnum FROM pg_attribute WHERE attrelid = conrelid AND attname = $2) = ANY (conkey)",
                &[table, key],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert!(without_key.is_empty(), "{table}: {without_key:?} do not include the distribution key {key}");
    }

    // Foreign keys: to a table placed before; a reference table refers only to reference tables;
    // between distributed tables, co-located and on their keys.
    let foreign_keys = db
        .query(
            "SELECT c.conname::text, c.conrelid::regclass::text, c.confrelid::regclass::text,
                    ARRAY(SELECT a.attname::text FROM unnest(c.conkey) k JOIN pg_attribute a
                           ON a.attrelid = c.conrelid AND a.attnum = k),
                    ARRAY(SELECT a.attname::text FROM unnest(c.confkey) k JOIN pg_attribute a
                           ON a.attrelid = c.confrelid AND a.attnum = k)
               FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace
              WHERE c.contype = 'f' AND n.nspname = 'queen'",
            &[],
        )
        .await
        .unwrap();
    assert!(!foreign_keys.is_empty());
    for row in &foreign_keys {
        let (name, from, to): (String, String, String) = (row.get(0), row.get(1), row.get(2));
        let (from_columns, to_columns): (Vec<String>, Vec<String>) = (row.get(3), row.get(4));
        let (source, target) = (&placements[&from], &placements[&to]);
        assert!(target.order < source.order || from == to, "{name}: {to} must be placed before {from}");
        match (&source.key, &target.key) {
            (None, Some(_)) => panic!("{name}: reference table {from} refers to distributed {to}"),
            (Some(from_key), Some(to_key)) => {
                assert_eq!(groups[&from], groups[&to], "{name}: {from} and {to} are not co-located");
                let on_keys = from_columns.iter().zip(&to_columns).any(|(f, t)| f == from_key && t == to_key);
                assert!(on_keys, "{name}: {from} -> {to} does not join {from_key} to {to_key}");
            }
            _ => {}
        }
    }
    let engine: Value =
        db.query_one("SELECT value FROM queen.system_state WHERE key = 'distribution'", &[]).await.unwrap().get(0);
    assert_eq!(engine, json!({"engine": "citus"}));

    // The broker's statements need nothing the branch removed: partitions created by many pushes
    // at once (one each), pushes, pops, acks, a queue's deletion with its message ids.
    let pushes = (0..8).map(|i| app.push(json!([{"queue": "spread", "partition": "new", "payload": i}])));
    futures::future::join_all(pushes).await;
    let named = app
        .count(
            "SELECT count(*) FROM queen.partitions p JOIN queen.queues q ON q.id = p.queue_id WHERE q.name = 'spread'",
        )
        .await;
    assert_eq!(named, 1, "concurrent first pushes made one partition");
    let popped = app.pop("queue/spread/partition/new", "batch=100").await;
    assert_eq!(popped.messages().len(), 8);
    let acked = app.ack_all(&popped.messages(), "completed", None).await;
    assert!(acked.iter().all(|a| a["success"] == true || a["status"] == "completed"), "{acked:?}");
    assert_eq!(app.delete("/api/v1/resources/queues/spread").await.status, reqwest::StatusCode::OK);
    assert_eq!(app.count("SELECT count(*) FROM queen.log_message_ids").await, 0, "the cascade took the message ids");
    assert_eq!(app.count("SELECT count(*) FROM queen.partition_names").await, 0);
}
