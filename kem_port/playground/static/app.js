// kem playground's page. Plain JS, no libraries: every text that comes from
// the kernel or the server goes in with textContent, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const code = $("code");
const CHECK_DELAY_MS = 350; // a pause in typing this long sends a check
let checkTimer = null;
let checkSeq = 0;
let modeTouched = false;
let errorLines = new Set();

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

// -- the editor: line numbers and diagnostics ------------------------------

function drawGutter() {
  const gutter = $("gutter");
  const lines = code.value.split("\n").length;
  gutter.replaceChildren();
  for (let n = 1; n <= lines; n++) {
    gutter.appendChild(el("div", n, errorLines.has(n) ? "err" : ""));
  }
  gutter.scrollTop = code.scrollTop;
}

function showDiagnostics(list) {
  const box = $("diagnostics");
  box.replaceChildren();
  errorLines = new Set(list.filter((d) => d.line > 0).map((d) => d.line));
  for (const d of list) {
    const item = el("li");
    item.dataset.line = d.line;
    item.dataset.col = d.col;
    item.appendChild(el("span", d.line > 0 ? `${d.line}:${d.col}` : "kernel", "where"));
    item.appendChild(el("span", d.message, "message"));
    item.addEventListener("click", () => moveTo(d.line, d.col));
    box.appendChild(item);
  }
  drawGutter();
}

function moveTo(line, col) {
  if (line < 1) return;
  const lines = code.value.split("\n");
  let offset = 0;
  for (let i = 0; i < line - 1 && i < lines.length; i++) offset += lines[i].length + 1;
  offset += Math.max(0, col - 1);
  code.focus();
  code.setSelectionRange(offset, offset);
}

// -- check as you type ---------------------------------------------------------

function scheduleCheck() {
  clearTimeout(checkTimer);
  checkTimer = setTimeout(check, CHECK_DELAY_MS);
}

async function post(route, body) {
  const response = await fetch(route, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  return response.json();
}

async function check() {
  const seq = ++checkSeq;
  setStatus("checking…", "");
  let answer;
  try {
    answer = await post("/api/check", { code: code.value, entry_point: $("entry").value, constants: constants() });
  } catch (err) {
    answer = { ok: false, error: { reason: "bad_args", detail: String(err.message || err) }, diagnostics: [] };
  }
  if (seq !== checkSeq) return; // a newer check is on its way
  showDiagnostics(answer.diagnostics || []);
  if (answer.error) {
    setStatus(`${answer.error.reason}: ${answer.error.detail}`, "bad");
    return;
  }
  if (answer.report) showReport(answer.report, answer.ok ? answer.mode : null);
  if (answer.ok) setStatus(answer.mode === "kem" ? "ok: a kem@1.0 kernel" : "ok: runs by named buffers", "ok");
  else setStatus(`error: ${answer.diagnostics.length} diagnostic(s)`, "bad");
}

function setStatus(text, cls) {
  const status = $("check-status");
  status.textContent = text;
  status.className = `status ${cls}`;
}

function showReport(report, mode) {
  const body = $("bindings").querySelector("tbody");
  body.replaceChildren();
  for (const b of report.bindings) {
    const row = el("tr");
    for (const v of [b.group, b.binding, b.name, b.role, b["kem@1.0"]]) row.appendChild(el("td", v));
    body.appendChild(row);
  }
  const entry = $("entry");
  const chosen = entry.value;
  entry.replaceChildren();
  for (const e of report.entry_points.filter((e) => e.stage === "compute")) entry.appendChild(el("option", e.name));
  if ([...entry.options].some((o) => o.value === chosen)) entry.value = chosen;
  if (report.adapter) $("adapter").textContent = report.adapter;
  if (!modeTouched && mode) $("mode").value = mode; // a kernel that does not compile keeps the mode it had
  drawNamedFields(report);
  showMode();
}

// -- the call's form ------------------------------------------------------------

function inputRow(name, size) {
  const row = $("input-template").content.firstElementChild.cloneNode(true);
  row.dataset.name = name;
  row.querySelector(".input-name").textContent = name;
  if (size) row.querySelector(".size").value = size;
  const kind = row.querySelector(".kind");
  kind.addEventListener("change", () => {
    row.querySelector(".size").hidden = row.querySelector(".seed").hidden = kind.value !== "random";
    row.querySelector(".file").hidden = kind.value !== "file";
    row.querySelector(".hex").hidden = kind.value !== "hex";
  });
  return row;
}

function drawNamedFields(report) {
  const box = $("named-fields");
  const kept = {};
  for (const row of box.querySelectorAll("[data-name]")) kept[row.dataset.name] = row;
  box.replaceChildren();
  for (const b of report.bindings) {
    if (b.role === "input" || b.role === "uniform") {
      box.appendChild(kept[b.name] && kept[b.name].classList.contains("input-row") ? kept[b.name] : inputRow(b.name, b.role === "uniform" ? 16 : 4096));
    } else if (b.role === "output") {
      const label = kept[b.name] && kept[b.name].tagName === "LABEL" ? kept[b.name] : el("label");
      if (!label.dataset.name) {
        label.dataset.name = b.name;
        label.appendChild(el("span", `${b.name} (output) bytes `));
        const size = el("input", null, "out-size");
        size.type = "number"; size.min = "0"; size.value = "4096";
        label.appendChild(size);
      }
      box.appendChild(label);
    }
  }
}

function showMode() {
  const named = $("mode").value === "named";
  $("kem-fields").hidden = named;
  $("named-fields").hidden = !named;
}

function constants() {
  const out = {};
  for (const part of $("constants").value.split(",")) {
    const [name, value] = part.split("=").map((s) => s && s.trim());
    if (name && value !== undefined && value !== "" && !Number.isNaN(Number(value))) out[name] = Number(value);
  }
  return out;
}

function bytesToBase64(bytes) {
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000) text += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

async function inputSpec(row) {
  const kind = row.querySelector(".kind").value;
  if (kind === "random") {
    return { kind, size: Number(row.querySelector(".size").value || 0), seed: Number(row.querySelector(".seed").value || 0) };
  }
  if (kind === "hex") return { kind, text: row.querySelector(".hex").value };
  const file = row.querySelector(".file").files[0];
  if (!file) throw new Error(`${row.dataset.name}: choose a file`);
  const bytes = new Uint8Array(await file.arrayBuffer());
  const png = bytes.length > 8 && bytes[0] === 0x89 && bytes[1] === 0x50 && bytes[2] === 0x4e && bytes[3] === 0x47;
  return { kind, data: bytesToBase64(bytes), png };
}

async function runBody() {
  const body = { code: code.value, mode: $("mode").value, entry_point: $("entry").value, constants: constants() };
  const how = $("dispatch").value;
  if (how) body[how] = [$("dx"), $("dy"), $("dz")].map((n) => Number(n.value || 1));
  if (body.mode === "kem") {
    body.input = await inputSpec($("input-spec").firstElementChild);
    if ($("output-size").value !== "") body.output_size = Number($("output-size").value);
    if ($("params").value.trim() !== "") body.params = $("params").value;
    body.debug = $("debug").checked;
  } else {
    body.buffers = {};
    body.outputs = {};
    for (const row of $("named-fields").querySelectorAll(".input-row")) body.buffers[row.dataset.name] = await inputSpec(row);
    for (const label of $("named-fields").querySelectorAll("label[data-name]")) {
      body.outputs[label.dataset.name] = Number(label.querySelector(".out-size").value || 0);
    }
  }
  return body;
}

// -- Run and its result ---------------------------------------------------------

async function run(event) {
  event.preventDefault();
  $("run").disabled = true;
  $("run-status").textContent = "running…";
  let answer;
  try {
    answer = await post("/api/run", await runBody());
  } catch (err) {
    answer = { ok: false, error: { reason: "bad_args", detail: String(err.message || err) }, diagnostics: [] };
  }
  $("run").disabled = false;
  $("run-status").textContent = answer.ok ? "done" : "failed";
  showResult(answer);
}

function hexDump(hex, total) {
  const lines = [];
  for (let offset = 0; offset < hex.length / 2; offset += 16) {
    const chunk = hex.slice(offset * 2, offset * 2 + 32);
    const pairs = chunk.match(/../g) || [];
    const ascii = pairs.map((p) => { const c = parseInt(p, 16); return c >= 32 && c < 127 ? String.fromCharCode(c) : "."; }).join("");
    lines.push(`${offset.toString(16).padStart(8, "0")}  ${pairs.join(" ").padEnd(47)}  |${ascii}|`);
  }
  if (total > hex.length / 2) lines.push(`… ${total - hex.length / 2} more bytes (${total} in all)`);
  if (total === 0) lines.push("(empty output)");
  return lines.join("\n");
}

function fact(name, value) {
  $("facts").appendChild(el("dt", name));
  $("facts").appendChild(el("dd", value));
}

function showResult(answer) {
  $("result").hidden = false;
  $("facts").replaceChildren();
  $("outputs").replaceChildren();
  $("debug-box").hidden = true;
  if (!answer.ok) {
    showDiagnostics(answer.diagnostics || []);
    $("outputs").appendChild(el("div", `${answer.error.reason}: ${answer.error.detail}`, "error"));
    return;
  }
  fact("dispatch rule", answer.dispatch_rule);
  if (answer.workgroups) fact("workgroups", answer.workgroups.join(" x "));
  const t = answer.timings_ms;
  fact("GPU time", answer.gpu_ms === null ? `not measured: ${answer.gpu_note}` : `${answer.gpu_ms} ms`);
  fact("run (submit to read back)", `${t.run} ms`);
  if (t.compile !== undefined) fact("compile", `${t.compile} ms`);
  fact("device", answer.warm ? "warm (opened by an earlier request)" : `opened: ${t.device_open} ms`);
  fact("input", `${answer.input.bytes} bytes` + (answer.input.image ? ` (PNG ${answer.input.image.join("x")})` : ""));
  if (answer.debug) {
    $("debug-box").hidden = false;
    $("debug-records").textContent = `${answer.debug.records.length} records, ${answer.debug.dropped} dropped: ${answer.debug.records.join(" ")}`;
  }
  for (const out of answer.outputs) {
    const box = el("div", null, "output");
    box.dataset.name = out.name;
    box.appendChild(el("h3", `${out.name}: ${out.bytes} bytes, sha256 ${out.sha256.slice(0, 16)}…`));
    if (out.png) {
      const img = el("img");
      img.alt = `${out.name} as an image`;
      img.src = `data:image/png;base64,${out.png}`;
      box.appendChild(img);
    }
    box.appendChild(el("pre", hexDump(out.hex, out.bytes), "hex"));
    $("outputs").appendChild(box);
  }
}

// -- wiring ------------------------------------------------------------------------

function start() {
  $("input-spec").appendChild(inputRow("input", 4096));
  code.addEventListener("input", () => { drawGutter(); scheduleCheck(); });
  code.addEventListener("scroll", () => { $("gutter").scrollTop = code.scrollTop; });
  code.addEventListener("keydown", (e) => {
    if (e.key !== "Tab") return; // a tab indents instead of leaving the editor
    e.preventDefault();
    code.setRangeText("    ", code.selectionStart, code.selectionEnd, "end");
    drawGutter();
    scheduleCheck();
  });
  for (const id of ["entry", "constants"]) $(id).addEventListener("change", scheduleCheck);
  $("mode").addEventListener("change", () => { modeTouched = true; showMode(); });
  $("form").addEventListener("submit", run);
  drawGutter();
  showMode();
  check();
}

document.addEventListener("DOMContentLoaded", start);
