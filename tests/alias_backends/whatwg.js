// A Node `http` server that routes on `new URL(req.url, base).pathname`,
// the way many small Node services do, for tests/alias_differential.rs.
//
// What it brings is the WHATWG URL parser's reading of a path: `\` is `/`,
// `..` is clamped at the root, `%2e`/`%2E` dot segments are resolved. The id
// is percent-decoded like any router's parameter. Nothing else is lenient.
'use strict';

const http = require('http');

const store = new Map();

function send(res, status, value) {
  const body = value === undefined ? '' : JSON.stringify(value);
  const headers = { 'Content-Length': Buffer.byteLength(body) };
  if (value !== undefined) headers['Content-Type'] = 'application/json';
  res.writeHead(status, headers);
  res.end(body);
}

function jsonObject(text) {
  try {
    const value = JSON.parse(text || '{}');
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? value : null;
  } catch (_) {
    return null;
  }
}

function route(req, res, text) {
  let pathname;
  try {
    pathname = new URL(req.url, 'http://backend.invalid').pathname;
  } catch (_) {
    return send(res, 400, { error: 'bad URL' });
  }
  if (pathname === '/_state') {
    if (req.method === 'GET') return send(res, 200, Object.fromEntries(store));
    if (req.method !== 'PUT') return send(res, 405, { error: 'method not allowed' });
    const body = jsonObject(text);
    if (body === null) return send(res, 400, { error: 'body is not a JSON object' });
    store.clear();
    for (const [id, item] of Object.entries(body)) store.set(id, item);
    return send(res, 204);
  }
  if (pathname === '/articles') {
    if (req.method === 'GET') return send(res, 200, [...store.values()]);
    if (req.method !== 'POST') return send(res, 405, { error: 'method not allowed' });
    const body = jsonObject(text);
    if (body === null) return send(res, 400, { error: 'body is not a JSON object' });
    const id = String(body.id || store.size + 1000);
    store.set(id, { ...body, id });
    return send(res, 201, store.get(id));
  }
  const m = /^\/articles\/([^/]+)$/.exec(pathname);
  if (!m) return send(res, 404, { error: 'no such route' });
  let id;
  try {
    id = decodeURIComponent(m[1]);
  } catch (_) {
    return send(res, 400, { error: 'bad id' });
  }
  if (!store.has(id)) return send(res, 404, { error: 'no such item' });
  switch (req.method) {
    case 'GET':
      return send(res, 200, store.get(id));
    case 'DELETE':
      store.delete(id);
      return send(res, 204);
    case 'PUT':
    case 'PATCH': {
      const body = jsonObject(text);
      if (body === null) return send(res, 400, { error: 'body is not a JSON object' });
      const base = req.method === 'PATCH' ? store.get(id) : {};
      store.set(id, { ...base, ...body, id });
      return send(res, 200, store.get(id));
    }
    default:
      return send(res, 405, { error: 'method not allowed' });
  }
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => route(req, res, Buffer.concat(chunks).toString('utf8')));
});
server.listen(Number(process.argv[2] || 0), '127.0.0.1', () => {
  console.log(`LISTENING 127.0.0.1:${server.address().port}`);
});
