"""What the fan-out benchmark and the demo set up around the sink: provider
credentials, Herald's configuration, Web Push subscriptions (real P-256 keys
and auth secrets; the sink does not decrypt) and device registrations."""
import base64
import json
import os
import sys

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from herald_proc import Client  # noqa: E402,F401  (benchmarks/herald_proc.py)

KEY_ID = "ABC123DEFG"
TEAM_ID = "TEAM123456"
TOPIC = "com.example.app"
PROJECT_ID = "herald-bench"
CLIENT_EMAIL = "herald@herald-bench.iam.gserviceaccount.com"
VAPID_SUBJECT = "mailto:ops@example.com"


def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def provider_keys(directory, sink):
    """Writes the APNs key (apns.p8), the FCM service account (fcm.json, its
    token_uri at the sink) and the VAPID key (vapid.pem); returns their paths."""
    paths = {"apns": os.path.join(directory, "apns.p8"), "fcm": os.path.join(directory, "fcm.json"),
             "vapid": os.path.join(directory, "vapid.pem")}
    with open(paths["apns"], "wb") as f:
        f.write(pem(ec.generate_private_key(ec.SECP256R1())))
    # Herald signs an RS256 assertion with it; the sink does not check it.
    fcm = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with open(paths["fcm"], "w") as f:
        json.dump({"type": "service_account", "project_id": PROJECT_ID, "private_key_id": "k1",
                   "private_key": pem(fcm).decode(), "client_email": CLIENT_EMAIL,
                   "token_uri": sink.fcm_url + "/token"}, f)
    with open(paths["vapid"], "wb") as f:
        f.write(pem(ec.generate_private_key(ec.SECP256R1())))
    for p in paths.values():
        os.chmod(p, 0o600)
    return paths


def herald_config(directory, sink, keys, log_level="warning", store=None, instance_id=None, delivery=None):
    """Herald's configuration against the sink. `store`: the [store] keys other
    than `key` (default: SQLite with `synchronous = full`; a PostgreSQL backend
    gives backend, dsn, password_file...); `instance_id`: [server] instance_id;
    `delivery`: [delivery] keys (default: none, every default)."""
    store = {"synchronous": "full"} if store is None else store
    store_lines = "".join(f"{k} = {v}\n" for k, v in store.items())
    delivery_lines = "".join(f"{k} = {v}\n" for k, v in (delivery or {}).items())
    instance = f"instance_id = {instance_id}\n" if instance_id else ""
    return f"""[server]
socket = {directory}/herald.sock
socket_mode = 0600
state_dir = {directory}
log_level = {log_level}
max_inflight = 2000
{instance}
[store]
key = {directory}/store.key
{store_lines}
[delivery]
{delivery_lines}
[endpoints]
apns_production = {sink.apns_url}
apns_development = {sink.apns_url}
fcm = {sink.fcm_url}
ca_file = {sink.ca}
webpush_allow_private = true

[app.default]
device_cap = 20
apns_key = {keys['apns']}
apns_key_id = {KEY_ID}
apns_team_id = {TEAM_ID}
apns_topic = {TOPIC}
fcm_credentials = {keys['fcm']}
vapid_key = {keys['vapid']}
vapid_subject = {VAPID_SUBJECT}
"""


def web_subscription(sink, index, tag):
    """A subscription as a browser hands it over: endpoint on one of the sink's
    origins (round robin), a fresh P-256 public key and a 16-byte auth secret."""
    key = ec.generate_private_key(ec.SECP256R1())
    point = key.public_key().public_bytes(serialization.Encoding.X962,
                                          serialization.PublicFormat.UncompressedPoint)
    return {"endpoint": f"{sink.web_origin(index)}/push/{tag}-{index:05d}",
            "keys": {"p256dh": b64u(point), "auth": b64u(os.urandom(16))}}


def apns_token(scenario_index, n):
    return f"{scenario_index + 1:08x}{n + 1:056x}"


def register(client, sink, scenario, scenario_index, users, per_user):
    """Registers `users` users with `per_user` = (web, apns, fcm) devices each,
    named `scenario-uNNN`; returns (user names, devices) where devices lists
    what each peer needs: {"platform", "token", "keys"?}."""
    n_web, n_apns, n_fcm = per_user
    names, params, devices = [], [], []
    web_i = apns_i = 0
    for u in range(users):
        user = f"{scenario}-u{u:03d}"
        names.append(user)
        for _ in range(n_web):
            s = web_subscription(sink, web_i, scenario)
            web_i += 1
            params.append({"user": user, "platform": "web", "token": s["endpoint"], "keys": s["keys"]})
            devices.append({"platform": "web", "token": s["endpoint"], "keys": s["keys"]})
        for _ in range(n_apns):
            t = apns_token(scenario_index, apns_i)
            apns_i += 1
            params.append({"user": user, "platform": "apns", "token": t})
            devices.append({"platform": "apns", "token": t})
        for k in range(n_fcm):
            t = f"bench-{scenario}-{u}-{k}"
            params.append({"user": user, "platform": "fcm", "token": t})
            devices.append({"platform": "fcm", "token": t})
    answers = client.pipelined("device.register", params)
    bad = [a for a in answers if not a or "result" not in a]
    if bad:
        raise RuntimeError(f"{scenario}: {len(bad)} of {len(params)} registrations failed, first: {bad[0]}")
    return names, devices
