"""``enforcement status | enable | disable | shadow | unshadow``: whether decisions bind."""

from __future__ import annotations

from state.live_config import SetEnforcement, decision_mode
from state.quota_types import QuotaType
from streaming.commands.admin.context import Admin
from streaming.commands.admin.output import print_json
from streaming.commands.admin.values import parse_quota_type
from streaming.commands.exit_codes import EXIT_OK


def enforcement_status(admin: Admin) -> int:
    live = admin.live()
    enforcement = live.config.enforcement
    modes = {q.value: decision_mode(live.config, q, exempt=False).value for q in QuotaType}
    if admin.args.output == "json":
        print_json(
            {
                "version": live.version,
                "enabled": enforcement.enabled,
                "shadow": sorted(q.value for q in enforcement.shadow),
                "modes": modes,
            }
        )
        return EXIT_OK
    state = "enabled" if enforcement.enabled else "DISABLED (no decision binds)"
    print(f"enforcement: {state} (version {live.version})")
    for quota, mode in modes.items():
        note = (
            " (shadow once enabled)"
            if not enforcement.enabled and QuotaType(quota) in enforcement.shadow
            else ""
        )
        print(f"  {quota}: {mode}{note}")
    return EXIT_OK


def switch_enforcement(admin: Admin) -> int:
    enable: bool = admin.args.enable
    live = admin.live()
    if live.config.enforcement.enabled == enable:
        state = "enabled" if enable else "disabled"
        print(f"enforcement is already {state} (version {live.version}); nothing written")
        return EXIT_OK
    admin.write(live, [SetEnforcement(enabled=enable, **admin.stamp())])
    return EXIT_OK


def shadow_quota_types(admin: Admin) -> int:
    on: bool = admin.args.shadow_on
    quota_types = list(dict.fromkeys(parse_quota_type(t) for t in admin.args.quota_types))
    live = admin.live()
    shadowed = live.config.enforcement.shadow
    to_change = [q for q in quota_types if (q in shadowed) != on]
    if not to_change:
        names = ", ".join(quota_types)
        state = "in" if on else "out of"
        print(f"{names} already {state} shadow mode (version {live.version}); nothing written")
        return EXIT_OK
    change = SetEnforcement(shadow={q.value: on for q in to_change}, **admin.stamp())
    admin.write(live, [change])
    return EXIT_OK
