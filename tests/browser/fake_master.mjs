// A stand-in Salt master for the browser test: two TCP listeners (publish and request ports) on
// the address given as the first argument, ports chosen by the kernel. Prints
// {"publish": PORT, "request": PORT} as one line once both listen, then holds every connection
// open (saltgate checks it with `probe: tcp`). The test kills it by PID to make it go DOWN.
import net from 'node:net';

const ip = process.argv[2];
if (!ip) {
  console.error('usage: node fake_master.mjs IP');
  process.exit(2);
}

function listen() {
  return new Promise((resolve, reject) => {
    const server = net.createServer((sock) => {
      sock.on('error', () => {});
      sock.resume(); // read and drop: a session stays open until the peer closes it
    });
    server.on('error', reject);
    server.listen(0, ip, () => resolve(server.address().port));
  });
}

try {
  const [publish, request] = await Promise.all([listen(), listen()]);
  process.stdout.write(JSON.stringify({ publish, request }) + '\n');
} catch (e) {
  console.error(`fake master on ${ip}: ${e.message}`);
  process.exit(1);
}
