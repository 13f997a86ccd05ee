// ps_client.test.js - an independent client of monolith-ps (issue #3).
//
// The C tests talk to the PS through our own client library and our own protobuf-c code, so
// a bug shared by both ends (a field number, a packed encoding, a status code) would go
// unnoticed. This test uses a different gRPC stack, @grpc/grpc-js with @grpc/proto-loader
// (protobufjs), reading the .proto files of proto/ as they are. It starts one monolith-ps
// (MT_PS_BIN; default build/release/ps/monolith-ps, as scripts/build.sh makes it) with one
// shard, slot 1 (dim 8, adagrad) and slot 2 (dim 4, sgd, lr 0.01), on 127.0.0.1 port 0 with
// --port-file, and checks:
//   - Health/Check answers SERVING;
//   - Lookup(train) of fids given as fixed64 (some above 2^53, one with the top bit set)
//     returns sum-of-dims floats, found = 1 each, values from the uniform init in
//     [-0.01, 0.01]; a non-train Lookup returns the same values and creates nothing;
//   - ApplyGradients on the sgd slot: w - lr*g exactly (float32 arithmetic), missing rows
//     counted;
//   - Stats: shard, slots (dim, optimizer), row count;
//   - bad input: unknown slot and wrong gradient length -> INVALID_ARGUMENT with a message
//     that names the problem, and nothing changes;
//   - Sync from version 0: a full stream whose fids are exactly the rows, with the current
//     values, ending with last = true; an incremental Sync afterwards lists a changed row;
//   - SIGTERM: the PS exits 0 (under ASan this also catches leaks and memory errors).
// The PS is killed at the end whatever happens, and its temporary directory removed.
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const REPO = path.resolve(__dirname, '..', '..');
const PS_BIN = process.env.MT_PS_BIN || path.join(REPO, 'build', 'release', 'ps', 'monolith-ps');
const PROTO_DIR = path.join(REPO, 'proto');

// Deadlines are generous: under ASan on a shared 2-core machine the PS is several times slower.
const START_TIMEOUT_MS = 60000;
const CALL_TIMEOUT_MS = 20000;

const LR = Math.fround(0.01); // slot 2's learning rate (the default), as the PS stores it
const INIT_SCALE = 0.01; // default init: uniform in [-init_scale, init_scale]
const DIMS = new Map([
    [1n, 8],
    [2n, 4],
]);

// Feature id: slot in the top 16 bits, value in the low 48 (see proto/monolith/v1/example.proto).
const fid = (slot, v) => (BigInt(slot) << 48n) | BigInt(v);
const slotOf = (f) => BigInt(f) >> 48n;
// longs: String -- fixed64 travels as decimal strings; BigInt keeps every bit.
const str = (fids) => fids.map((f) => f.toString());

const F1 = [fid(1, 5), fid(1, 0xffffffffffffn), fid(1, 123456789)];
const F2 = [fid(2, 7), fid(2, 0xabcdef012345n)];
const FIDS = [...F1, ...F2];
const created = new Set(); // every fid that got a row (train lookups), as decimal strings

let tmp = null; // temporary directory: config, port file, log
let ps = null; // the child process
let psExit = null; // resolves to {code, signal} when it exits
let client = null; // monolith.v1.ParameterServer
let health = null; // grpc.health.v1.Health

function killPs() {
    if (ps && ps.exitCode === null && ps.signalCode === null) {
        try {
            ps.kill('SIGKILL');
        } catch (_) {
            /* already gone */
        }
    }
}
// Last resort if the test process ends some other way (uncaught error, signal); SIGKILL is
// covered by the PS's parent-death signal (see before()).
function cleanup() {
    killPs();
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
}
process.on('exit', cleanup);
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
    process.on(sig, () => {
        cleanup();
        process.exit(128 + os.constants.signals[sig]);
    });
}

function psLog() {
    try {
        return fs.readFileSync(path.join(tmp, 'ps.log'), 'utf8').split('\n').slice(-100).join('\n');
    } catch (_) {
        return '(no log)';
    }
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitForPort(portFile) {
    const deadline = Date.now() + START_TIMEOUT_MS;
    while (Date.now() < deadline) {
        if (ps.exitCode !== null || ps.signalCode !== null) {
            const how = ps.exitCode ?? ps.signalCode;
            throw new Error(`monolith-ps exited (${how}) before serving:\n${psLog()}`);
        }
        let text = '';
        try {
            text = fs.readFileSync(portFile, 'utf8');
        } catch (_) {
            /* not written yet */
        }
        const m = /^(\d+)\n/.exec(text); // the newline: the file is complete
        if (m && Number(m[1]) > 0) return Number(m[1]);
        await sleep(50);
    }
    throw new Error(`no port in ${portFile} after ${START_TIMEOUT_MS} ms:\n${psLog()}`);
}

function unary(c, method, req) {
    return new Promise((resolve, reject) => {
        c[method](req, { deadline: Date.now() + CALL_TIMEOUT_MS }, (err, res) =>
            err ? reject(err) : resolve(res),
        );
    });
}

// Runs a Sync stream to its end: {chunks, status}.
function sync(req) {
    return new Promise((resolve, reject) => {
        const chunks = [];
        const call = client.Sync(req, { deadline: Date.now() + CALL_TIMEOUT_MS });
        call.on('data', (ch) => chunks.push(ch));
        call.on('error', reject);
        call.on('status', (st) => {
            if (st.code === grpc.status.OK) resolve({ chunks, status: st });
        });
    });
}

async function lookup(fids, train) {
    const res = await unary(client, 'Lookup', { fids: str(fids), train });
    if (train) {
        res.found.forEach((b, i) => {
            if (b === 1) created.add(fids[i].toString());
        });
    }
    return res;
}

// Splits packed values into one array per fid (dims by slot).
function rows(fids, values) {
    const out = [];
    let off = 0;
    for (const f of fids) {
        const d = DIMS.get(slotOf(f));
        out.push(values.slice(off, off + d));
        off += d;
    }
    assert.equal(off, values.length, 'values length = sum of dims');
    return out;
}

async function expectStatus(promise, code, messageRe) {
    await assert.rejects(promise, (err) => {
        assert.equal(err.code, code, `status ${err.code} (${err.details}), expected ${code}`);
        assert.match(err.details, messageRe);
        return true;
    });
}

before(async () => {
    assert.ok(fs.existsSync(PS_BIN), `monolith-ps not found at ${PS_BIN} (set MT_PS_BIN)`);
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'mt-node-ps-'));
    const conf = path.join(tmp, 'ps.conf');
    const portFile = path.join(tmp, 'port');
    fs.writeFileSync(
        conf,
        [
            '[cluster]',
            'num_shards = 1',
            '[ps]',
            'listen = 127.0.0.1:0', // any free port: read back from --port-file
            'threads = 2',
            'snapshot_interval_s = 0',
            'expire_interval_ms = 0',
            '[table]',
            'shards_log2 = 2',
            'filter_bytes = 65536',
            'changelog_entries = 4096',
            '[slot.1]',
            'dim = 8',
            'optimizer = adagrad',
            '[slot.2]',
            'dim = 4',
            'optimizer = sgd',
            '',
        ].join('\n'),
    );
    const log = fs.openSync(path.join(tmp, 'ps.log'), 'w');
    // slot 2's lr is the default; --set states it here and checks that overrides work.
    const args = ['--config', conf, '--set', 'slot.2.lr=0.01', '--port-file', portFile];
    // If this process dies without running its exit handler (SIGKILL, or the runner's pipe
    // closing under it), the kernel kills the PS: setpriv sets PR_SET_PDEATHSIG, then execs it.
    const setpriv = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => fs.existsSync(p));
    const [cmd, argv] = setpriv
        ? [setpriv, ['--pdeathsig', 'KILL', '--', PS_BIN, ...args]]
        : [PS_BIN, args];
    ps = spawn(cmd, argv, { stdio: ['ignore', log, log] });
    fs.closeSync(log);
    psExit = new Promise((resolve) => ps.on('exit', (code, signal) => resolve({ code, signal })));
    ps.on('error', () => {}); // a spawn error shows as an exit before the port file

    const port = await waitForPort(portFile);
    const def = protoLoader.loadSync(['monolith/v1/ps.proto', 'grpc/health/v1/health.proto'], {
        includeDirs: [PROTO_DIR],
        keepCase: true,
        longs: String,
        enums: String,
        bytes: Buffer,
        defaults: true,
    });
    const pkg = grpc.loadPackageDefinition(def);
    const addr = `127.0.0.1:${port}`;
    client = new pkg.monolith.v1.ParameterServer(addr, grpc.credentials.createInsecure());
    health = new pkg.grpc.health.v1.Health(addr, grpc.credentials.createInsecure());
});

after(async () => {
    if (client) client.close();
    if (health) health.close();
    if (ps && ps.exitCode === null && ps.signalCode === null) {
        killPs();
        await psExit;
    }
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
});

test('Health/Check answers SERVING', async () => {
    const res = await unary(health, 'Check', { service: '' });
    assert.equal(res.status, 'SERVING');
});

test('Lookup(train) creates rows from the uniform init; a non-train Lookup reads them back', async () => {
    const a = await lookup(FIDS, true);
    assert.equal(a.values.length, 3 * 8 + 2 * 4);
    assert.ok(Buffer.isBuffer(a.found));
    assert.deepEqual([...a.found], [1, 1, 1, 1, 1]);
    for (const v of a.values) {
        assert.ok(Number.isFinite(v) && v >= -INIT_SCALE && v <= INIT_SCALE, `init value ${v}`);
    }
    const r = rows(FIDS, a.values);
    // Not the zeros of a missing row, and each id gets its own row.
    for (const row of r) assert.ok(row.some((v) => v !== 0), 'row is all zeros');
    const keys = new Set(r.map((row) => row.join(',')));
    assert.equal(keys.size, FIDS.length, 'two ids got the same row');

    const b = await lookup(FIDS, false);
    assert.deepEqual([...b.found], [1, 1, 1, 1, 1]);
    assert.deepEqual(b.values, a.values);

    // Again with train: an existing row is returned as it is, not re-initialized.
    const c = await lookup(FIDS, true);
    assert.deepEqual(c.values, a.values);
});

test('a non-train Lookup of unknown ids finds nothing and creates nothing', async () => {
    const fresh = [fid(1, 0xfeedfacecafen), fid(2, 424242)];
    for (let i = 0; i < 2; i++) {
        const res = await lookup(fresh, false);
        assert.deepEqual([...res.found], [0, 0]);
        assert.equal(res.values.length, 8 + 4);
        assert.ok(res.values.every((v) => v === 0), 'missing ids read as zeros');
    }
});

test('ApplyGradients on the sgd slot gives w - lr*g exactly', async () => {
    const before_ = rows(F2, (await lookup(F2, false)).values);
    const noRow = fid(2, 999999); // never looked up with train: no row, gradient dropped
    const g = [0.5, -1, 2, 0.25, -0.125, 4, -3, 1.5, 7, 7, 7, 7];
    const res = await unary(client, 'ApplyGradients', {
        fids: str([...F2, noRow]),
        grads: g,
        step: '1',
    });
    assert.equal(res.applied, '2');
    assert.equal(res.missing, '1');

    const afterRes = await lookup([...F2, noRow], false);
    assert.deepEqual([...afterRes.found], [1, 1, 0]);
    const got = rows([...F2, noRow], afterRes.values);
    for (let i = 0; i < F2.length; i++) {
        for (let k = 0; k < 4; k++) {
            // float32: w -= lr * g (lr*g is exact here: g is a small multiple of a power of 2)
            const want = Math.fround(before_[i][k] - Math.fround(LR * g[i * 4 + k]));
            assert.equal(got[i][k], want, `fid ${F2[i]} [${k}]: ${got[i][k]} != ${want}`);
            assert.notEqual(got[i][k], before_[i][k]);
        }
    }
    assert.deepEqual(got[2], [0, 0, 0, 0]);
});

test('Stats lists the slots, the shard and the rows', async () => {
    const s = await unary(client, 'Stats', {});
    assert.equal(s.shard, 0);
    assert.equal(s.num_shards, 1);
    assert.notEqual(s.incarnation, '0');
    assert.equal(s.rows, String(created.size));
    assert.equal(created.size, FIDS.length);
    const slots = s.slots
        .map((x) => ({ slot: x.slot, dim: x.dim, optimizer: x.optimizer, fp16: x.fp16 }))
        .sort((x, y) => x.slot - y.slot);
    assert.deepEqual(slots, [
        { slot: 1, dim: 8, optimizer: 'adagrad', fp16: false },
        { slot: 2, dim: 4, optimizer: 'sgd', fp16: false },
    ]);
});

test('Lookup of an unknown slot is INVALID_ARGUMENT naming the slot', async () => {
    // slot 65535: the fid has its top bit set, so it must travel as an unsigned 64-bit value
    const bad = fid(0xffff, 9);
    await expectStatus(
        unary(client, 'Lookup', { fids: str([F1[0], bad]), train: true }),
        grpc.status.INVALID_ARGUMENT,
        /fid 1 \(0xffff000000000009\): slot 65535 is not configured/,
    );
    await expectStatus(
        unary(client, 'Lookup', { fids: str([fid(3, 1)]), train: false }),
        grpc.status.INVALID_ARGUMENT,
        /slot 3 is not configured/,
    );
    // The good id of the failed request was not touched, and nothing was created.
    const s = await unary(client, 'Stats', {});
    assert.equal(s.rows, String(created.size));
});

test('ApplyGradients with a wrong gradient length is INVALID_ARGUMENT and changes nothing', async () => {
    const before_ = (await lookup(F2, false)).values;
    await expectStatus(
        unary(client, 'ApplyGradients', { fids: str([F2[0]]), grads: [1, 2, 3] }),
        grpc.status.INVALID_ARGUMENT,
        /grads has 3 floats, the 1 fids need 4/,
    );
    await expectStatus(
        unary(client, 'ApplyGradients', { fids: str(F2), grads: new Array(9).fill(1) }),
        grpc.status.INVALID_ARGUMENT,
        /grads has 9 floats, the 2 fids need 8/,
    );
    assert.deepEqual((await lookup(F2, false)).values, before_);
});

test('Sync from version 0 streams every row with its values and ends with last=true', async () => {
    const cur = rows(FIDS, (await lookup(FIDS, false)).values);
    const want = new Map(FIDS.map((f, i) => [f.toString(), cur[i]]));
    const stats = await unary(client, 'Stats', {});

    const { chunks } = await sync({ since_version: '0', incarnation: '0', max_chunk_fids: 2 });
    assert.ok(chunks.length >= 3, `${chunks.length} chunks for 5 rows of at most 2`);
    assert.equal(chunks[0].full, true);
    chunks.forEach((ch, i) => {
        assert.equal(ch.last, i === chunks.length - 1, `chunk ${i} of ${chunks.length}: last`);
        assert.equal(ch.incarnation, stats.incarnation);
        assert.ok(ch.fids.length <= 2);
    });
    const seen = new Map();
    for (const ch of chunks) {
        assert.equal(ch.deleted.length, ch.fids.length);
        let off = 0;
        ch.fids.forEach((f, i) => {
            assert.equal(ch.deleted[i], 0, `fid ${f} deleted in a full stream`);
            const d = DIMS.get(slotOf(f));
            assert.ok(d, `fid ${f}: unknown slot`);
            assert.ok(!seen.has(f), `fid ${f} twice in a full stream`);
            seen.set(f, ch.values.slice(off, off + d));
            off += d;
        });
        assert.equal(off, ch.values.length);
    }
    // Exactly the rows: the fids round-trip bit for bit (several are above 2^53).
    assert.deepEqual([...seen.keys()].sort(), [...want.keys()].sort());
    for (const [f, v] of want) assert.deepEqual(seen.get(f), v, `fid ${f} values`);
    const upto = chunks[chunks.length - 1].upto_version;
    assert.notEqual(upto, '0');

    // Incremental: after one more update, a sync from `upto` lists the changed row.
    await unary(client, 'ApplyGradients', { fids: str([F2[1]]), grads: [1, 1, 1, 1] });
    const now = rows([F2[1]], (await lookup([F2[1]], false)).values)[0];
    const inc = await sync({ since_version: upto, incarnation: stats.incarnation });
    assert.equal(inc.chunks[0].full, false);
    assert.equal(inc.chunks[inc.chunks.length - 1].last, true);
    const last = new Map();
    for (const ch of inc.chunks) {
        let off = 0;
        ch.fids.forEach((f, i) => {
            const d = ch.deleted[i] ? 0 : DIMS.get(slotOf(f));
            last.set(f, ch.values.slice(off, off + d));
            off += d;
        });
    }
    assert.ok(last.has(F2[1].toString()), 'the changed fid is in the incremental sync');
    assert.deepEqual(last.get(F2[1].toString()), now);
    assert.ok(BigInt(inc.chunks[0].upto_version) > BigInt(upto));
});

test('SIGTERM: the PS stops and exits 0', async () => {
    client.close();
    health.close();
    client = health = null;
    ps.kill('SIGTERM');
    const timer = setTimeout(killPs, START_TIMEOUT_MS);
    const { code, signal } = await psExit;
    clearTimeout(timer);
    assert.equal(signal, null, `killed by ${signal}:\n${psLog()}`);
    assert.equal(code, 0, `exit code ${code}:\n${psLog()}`);
});
