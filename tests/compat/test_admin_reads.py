"""Every read of the client's admin API (§2.6: resources, status, analytics, system) through the
official client: each answers, and answers what the queue it was shown holds."""

from datetime import datetime, timedelta, timezone

from compat_helpers import client, pop_retry, push_all, run, unique


def test_every_admin_read_answers_about_the_queue_it_was_shown(queen_url):
    async def body():
        name, group = unique("reads"), unique("g")
        async with client(queen_url) as q:
            await q.queue(name).namespace("reads-ns").task("reads-task").create()
            await push_all(q, name, [{"id": i} for i in range(3)], partition="p1")
            popped = await pop_retry(q.queue(name).group(group).batch(1).wait(False))
            assert (await q.ack(popped, True, {"group": group}))["success"] is True

            overview = await q.admin.get_overview()
            assert overview["queues"] >= 1, overview
            namespaces = await q.admin.get_namespaces()
            assert "reads-ns" in str(namespaces), namespaces
            tasks = await q.admin.get_tasks()
            assert "reads-task" in str(tasks), tasks
            listed = await q.admin.list_queues(limit=1000)
            assert name in str(listed), listed
            # `search` (as the client documents it): the queues whose names hold it, in any case.
            searched = await q.admin.list_queues(search=name[-12:].upper())
            assert [found["name"] for found in searched["queues"]] == [name], searched
            queue = await q.admin.get_queue(name)
            assert queue["name"] == name, queue
            depth = await q.admin.get_queue_depth(name, group)
            assert depth["pending"] == 2, depth
            partitions = await q.admin.get_partitions(queue=name)
            assert "p1" in str(partitions), partitions
            # `offset` (as the client documents list_messages): newest first, the newest passed over.
            page = await q.admin.list_messages(queue=name, limit=1, offset=1)
            assert [m["data"] for m in page["messages"]] == [{"id": 1}], page

            status = await q.admin.get_status()
            assert isinstance(status, dict) and status, status
            stats = await q.admin.get_queue_stats(limit=1000)
            assert name in str(stats), stats
            detail = await q.admin.get_queue_detail(name)
            assert group in str(detail), detail
            analytics = await q.admin.get_analytics()
            assert analytics["broker"]["messagesPushed"] >= 3, analytics

            # The broker records its first sample as it starts; `from`/`to` as the clients send them.
            since = (datetime.now(timezone.utc) - timedelta(hours=2)).isoformat()
            system = await q.admin.get_system_metrics(**{"from": since})
            points = [p for b in system["brokers"] for p in b["points"]]
            assert points and all(p["residentBytes"] > 0 for p in points), system
            assert all(p["dbPool"]["max"] >= 1 for p in points), system
            workers = await q.admin.get_worker_metrics(**{"from": since, "to": datetime.now(timezone.utc).isoformat()})
            assert workers["brokers"], workers
            assert workers["intervalSeconds"] >= 1, workers

            health = await q.admin.health()
            assert health["status"] == "healthy", health
            metrics = await q.admin.metrics()
            assert metrics is not None and "queen_messages_pushed_total" in str(metrics), metrics

    run(body())
