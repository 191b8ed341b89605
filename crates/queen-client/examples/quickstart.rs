use queen_client::{Client, Pop, PushItem};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), queen_client::Error> {
    let client = Client::new("http://localhost:6632")?;
    client.push(&[PushItem::new("orders", &json!({"id": 1, "total": 9.5}))?.with_partition("customer-7")]).await?;
    let billing = client.consumer(Pop::queue("orders").group("billing")).concurrency(4).start(|order| async move {
        println!("order {} of {}", order.data, order.partition);
        Ok::<_, String>(()) // an Err is acknowledged as failed: retried, then dead-lettered
    })?;
    tokio::signal::ctrl_c().await.ok();
    billing.shutdown().await?; // handlers in flight finish and are acknowledged
    Ok(())
}
