// The MCP App side of the timeline view (io.modelcontextprotocol/ui): the ui/initialize handshake with the host over
// postMessage, then every show_timeline result the host sends is drawn with NsTimeline.
"use strict";
(() => {
  const root = document.getElementById("timeline");
  const pending = new Map();
  let nextId = 1;

  function send(message) { window.parent.postMessage({jsonrpc: "2.0", ...message}, "*"); }

  function request(method, params) {
    const id = nextId++;
    send({id: id, method: method, params: params});
    return new Promise((resolve, reject) => pending.set(id, {resolve, reject}));
  }

  function show(result) {
    if (result.structuredContent) {
      NsTimeline.draw(root, result.structuredContent);
    } else {
      root.textContent = (result.content || []).map(c => c.text || "").join("\n");
    }
    send({method: "ui/notifications/size-changed", params: {height: document.documentElement.scrollHeight}});
  }

  window.addEventListener("message", evt => {
    const msg = evt.data;
    if (!msg || msg.jsonrpc !== "2.0") return;
    if (msg.id !== undefined && pending.has(msg.id)) {
      const {resolve, reject} = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.error) reject(new Error(msg.error.message)); else resolve(msg.result);
    } else if (msg.method === "ui/notifications/tool-result") {
      show(msg.params);
    }
  });

  if (window.parent !== window) {
    request("ui/initialize", {appInfo: {name: "stallhound timeline", version: "1"}, appCapabilities: {},
                              protocolVersion: "2026-01-26"})
      .then(() => send({method: "ui/notifications/initialized", params: {}}))
      .catch(err => { root.textContent = "the host refused the view: " + err.message; });
  } else {
    root.textContent = "This view draws show_timeline results inside an MCP host that shows MCP Apps.";
  }
})();
