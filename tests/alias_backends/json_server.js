// json-server 0.17 as a library, for tests/alias_differential.rs: its own
// defaults and router, exactly as `json-server db.json` would serve them,
// plus a `/_state` route to read and reset the store directly.
//
// What it brings is Express's reading of a request: routes match without
// regard to case and with an optional trailing slash, route parameters are
// percent-decoded, and the router's method-override middleware turns a POST
// with `X-HTTP-Method-Override` into the method it names (that header only,
// and on POST only: `method-override` 3.0's defaults).
//
// json-server is found through NODE_PATH (.tools/alias/node_modules).
'use strict';

const jsonServer = require('json-server');

const server = jsonServer.create();
const router = jsonServer.router({ articles: [] });

server.get('/_state', (req, res) => {
  const items = router.db.get('articles').value();
  res.json(Object.fromEntries(items.map((item) => [String(item.id), item])));
});
server.put('/_state', jsonServer.bodyParser, (req, res) => {
  router.db.set('articles', Object.values(req.body || {})).write();
  res.sendStatus(204);
});

server.use(jsonServer.defaults({ logger: false, noGzip: true }));
server.use(router);

const listener = server.listen(Number(process.argv[2] || 0), '127.0.0.1', () => {
  console.log(`LISTENING 127.0.0.1:${listener.address().port}`);
});
