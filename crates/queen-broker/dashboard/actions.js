// Actions on consumer groups that more than one page offers: seek (to the end or to a time, per
// queue or per partition) and delete. Each asks first, in an in-page dialog.

import { h, num, parseTime, field } from "./dom.js";
import { post, del, path, withQuery } from "./api.js";
import { flash } from "./ui.js";
import { openDialog } from "./ui.js";

export const QUEUE_MODE = "__QUEUE_MODE__";

/** A group's name as shown: queue mode is named for what it is. */
export function groupLabel(name) {
  return name === QUEUE_MODE ? h("span", { title: QUEUE_MODE }, "queue mode") : name;
}

function seekUrl(group, queue, partitionId) {
  return partitionId === undefined || partitionId === null
    ? path("consumer-groups", group, "queues", queue, "seek")
    : path("consumer-groups", group, "queues", queue, "partitions", partitionId, "seek");
}

function where(group, queue, partition) {
  const text = [h("strong", {}, groupLabel(group)), " on queue ", h("strong", {}, queue)];
  if (partition !== undefined && partition !== null) text.push(", partition ", h("strong", {}, partition));
  return text;
}

/**
 * Moves the group's cursor to the partition's end (or every partition's, without a partition).
 * The per-partition route takes an empty body for this; the per-queue one needs {"toEnd": true}.
 */
export async function skipToEnd({ group, queue, partitionId, partition, behind }) {
  const perPartition = partitionId !== undefined && partitionId !== null;
  const result = await openDialog({
    id: "skip-dialog",
    title: "Skip to the end",
    confirm: "Skip to end",
    danger: true,
    content: [
      h("p", {}, "Move the cursor of ", where(group, queue, partition), " past the last message."),
      h("p", {}, behind ? `The ${num(behind)} unread message(s) there will not be delivered to this group.` : "Nothing is unread there now."),
      h("p", { class: "muted" }, "A live lease is released; its batch's acks will be refused."),
    ],
    action: () => post(seekUrl(group, queue, partitionId), perPartition ? undefined : { toEnd: true }),
  });
  if (result) flash(`Cursor of ${group} on ${queue}${perPartition ? ` / ${partition}` : ""} moved to the end (${result.partitionsUpdated} partition(s)).`);
  return result;
}

/** Moves the group's cursor to the first segment at or after a time (replays from there). */
export async function seekToTime({ group, queue, partitionId, partition }) {
  const input = h("input", { type: "text", class: "input", name: "timestamp", placeholder: "2026-07-29T14:00:00Z", autocomplete: "off", "data-role": "seek-time" });
  const quick = (label, value) => h("button", { type: "button", class: "button button-small", onclick: () => (input.value = value()) }, label);
  const local = (ms) => {
    const at = new Date(Date.now() - ms);
    const pad = (n) => String(n).padStart(2, "0");
    return `${at.getFullYear()}-${pad(at.getMonth() + 1)}-${pad(at.getDate())} ${pad(at.getHours())}:${pad(at.getMinutes())}:${pad(at.getSeconds())}`;
  };
  const result = await openDialog({
    id: "seek-dialog",
    title: "Seek to a time",
    confirm: "Seek",
    content: [
      h("p", {}, "Move the cursor of ", where(group, queue, partition), " to the first message stored at or after this time; the group reads again from there."),
      field("Time", input, "ISO 8601 (2026-07-29T14:00:00Z), local time (2026-07-29 14:00), now, or -15m / -2h / -1d"),
      h("div", { class: "quick" }, quick("15 min ago", () => local(15 * 60000)), quick("1 hour ago", () => local(3600000)), quick("24 hours ago", () => local(86400000))),
    ],
    action: () => post(seekUrl(group, queue, partitionId), { timestamp: parseTime(input.value) }),
  });
  if (result) flash(`Cursor of ${group} on ${queue}${partition ? ` / ${partition}` : ""} moved to ${result.targetTimestamp} (${result.partitionsUpdated} partition(s)).`);
  return result;
}

/** Deletes a group (everywhere, or on one queue); the operator types its name to confirm. */
export async function deleteGroup(group, queue) {
  const metadata = h("input", { type: "checkbox", checked: true, "data-role": "delete-metadata" });
  const url = queue ? path("consumer-groups", group, "queues", queue) : path("consumer-groups", group);
  const result = await openDialog({
    id: "delete-group-dialog",
    title: queue ? "Delete the group on this queue" : "Delete the consumer group",
    confirm: "Delete",
    danger: true,
    typeToConfirm: group,
    content: [
      h("p", {}, "Drop every cursor (and so every lease) of ", h("strong", {}, groupLabel(group)), queue ? [" on queue ", h("strong", {}, queue)] : " on every queue", "."),
      h("p", {}, "If the group pops again it starts as a new group, from its subscription."),
      h("label", { class: "check" }, metadata, " Also delete its subscription (where it starts on new partitions)"),
    ],
    action: () => del(withQuery(url, { deleteMetadata: metadata.checked ? "true" : "false" })),
  });
  if (result) flash(`Deleted ${group}${queue ? ` on ${queue}` : ""}: ${result.deletedPartitions} cursor(s)${result.metadataDeleted ? ", subscription too" : ""}.`);
  return result;
}
