"""The user's phone in tau2-bench telecom: its state, connectivity model, 30 user tools and the sync
with the provider database (host code, no jax).

Behaviour follows tau2-bench (``sierra-research/tau2-bench``) at commit ``a2c0247``, as written down
in the project's telecom specification (sections 4, 5 and 6.4): every text is tau2's (emoji as raw
UTF-8), the checks run in tau2's order and the same tools run a network search, so the user DB's hash
after any sequence of calls equals tau2's.

**The user DB** is a plain dict ``{"device": {...}, "surroundings": {...}}`` in tau2's canonical field
order (:data:`DEVICE_FIELDS`, :data:`APN_FIELDS`, :data:`SURROUNDINGS_FIELDS`), every field present
(nulls and defaults included), enum values as strings and numbers as stored (``battery_level`` 80 an
int). :func:`load_user_db` reads ``user_db.toml`` (fields the file omits take tau2's model defaults);
the packaged file hashes to :data:`INITIAL_USER_HASH` (`jaxagent.envs.tau2.db.db_hash`).

**The connectivity model** is a few pure functions of the user DB: :func:`sim_status`,
:func:`network_search` (the only one that writes), :func:`mobile_data_working`, :func:`speed_test`,
:func:`can_send_mms` and :func:`status_bar_text`. They read the stored device fields, so a phone
shows a stale connection until something searches.

:class:`TelecomUserTools` mutates a user DB in place: the 30 user tools (tau2's names and
parameters; the class name makes Python's own argument errors read like tau2's), tau2's non-tool
functions used by initialization actions and env assertions (:data:`USER_ENV_FUNCTIONS`). Methods
return raw values (texts, bools for assertions, None where tau2 returns nothing). tau2's quirks are
kept on purpose:

* ``turn_airplane_mode_on``/``_off``, ``turn_data_off`` and ``turn_roaming_on``/``_off`` toggle once
  and, when that left the wrong state, toggle back (two searches), as tau2's code does;
* ``set_network_mode_preference`` with a value that is not a string stores it, searches (the
  preference is then none of the four, so 4G) and fails reading its ``.value``; ``set_apn_settings``
  with a value that is not an object stores it and fails, and every later use of the APN settings
  then fails with Python's attribute error, as tau2's unvalidated assignment does;
* ``set_apn_settings`` validates an object with the pydantic model :class:`APNSettings` (unknown keys
  forbidden, ``apn_name`` one of :class:`APNNames`): the error is pydantic's own text, its
  documentation link written at :data:`PYDANTIC_REFERENCE_VERSION` as tau2's reference run printed it;
* ``check_vpn_status`` shows the details as a Python dict repr with the performance as the enum's
  repr (``<PerformanceLevel.EXCELLENT: 'excellent'>``).

One tau2 bug is **not** reproduced: tau2 hands every ``connect_vpn`` the same details object, which
``break_vpn`` degrades for every later environment of the process; here each connection gets a fresh
dict.

:func:`execute_user` turns one user tool call into the tool message content and never raises;
:func:`user_tool_schemas` gives tau2's 30 OpenAI function schemas, byte for byte; :func:`sync` is the
environment's sync of the phone with the provider DB (spec 5; it never searches).
"""

from __future__ import annotations

import copy
import enum
import json
import re
from pathlib import Path
from typing import Any

import pydantic

from jaxagent.envs.tau2.db import data_file, load_canonical
from jaxagent.envs.tau2.domains.telecom.db import parse_toml
from jaxagent.envs.tau2.tools import ToolError, ToolResult, check_schemas, run_tool, schema_file_text

__all__ = [
    "APN_FIELDS",
    "DEFAULT_DATA_DIR",
    "DEVICE_FIELDS",
    "INITIAL_USER_HASH",
    "PERMISSIONS",
    "PYDANTIC_REFERENCE_VERSION",
    "SURROUNDINGS_FIELDS",
    "USER_DB_FILE",
    "USER_ENV_FUNCTIONS",
    "USER_READ_TOOLS",
    "USER_TOOL_NAMES",
    "USER_TOOL_SCHEMAS_FILE",
    "USER_WRITE_TOOLS",
    "APNNames",
    "APNSettings",
    "NetworkModePreference",
    "NetworkStatus",
    "PerformanceLevel",
    "TelecomUserTools",
    "can_send_mms",
    "canonicalize_user_db",
    "check_user_tool_schemas",
    "default_apn_settings",
    "execute_user",
    "load_user_db",
    "mobile_data_working",
    "network_search",
    "sim_status",
    "speed_test",
    "status_bar_text",
    "sync",
    "user_tool_schemas",
]

DEFAULT_DATA_DIR: Path = Path(__file__).resolve().parents[4] / "data" / "tau2_telecom"
"""The packaged copy of tau2's telecom data (``jaxagent/data/tau2_telecom``)."""
USER_DB_FILE = "user_db.toml"
USER_TOOL_SCHEMAS_FILE: Path = DEFAULT_DATA_DIR / "user_tool_schemas.json"
"""tau2's 30 user-tool OpenAI function schemas as its own code generates them (``{"source": ...,
"tools": [...]}``, MIT, Sierra Research); :func:`user_tool_schemas` serves its ``tools`` unchanged."""
INITIAL_USER_HASH = "e1f3a8637388808221228ff3f87294444e6b64caf721f5eb243a85d0a9380b28"
"""`jaxagent.envs.tau2.db.db_hash` of the packaged user DB as loaded (spec 6.4)."""

USER_TOOL_NAMES: tuple[str, ...] = (
    "check_status_bar", "check_network_status", "check_network_mode_preference", "set_network_mode_preference",
    "run_speed_test", "toggle_airplane_mode", "check_sim_status", "reseat_sim_card", "toggle_data",
    "toggle_roaming", "check_data_restriction_status", "toggle_data_saver_mode", "check_apn_settings",
    "set_apn_settings", "reset_apn_settings", "check_wifi_status", "toggle_wifi", "check_wifi_calling_status",
    "toggle_wifi_calling", "check_vpn_status", "connect_vpn", "disconnect_vpn", "check_installed_apps",
    "check_app_status", "check_app_permissions", "grant_app_permission", "can_send_mms", "reboot_device",
    "check_payment_request", "make_payment")
"""The 30 user tools in tau2's serving (schema) order."""
USER_READ_TOOLS: frozenset[str] = frozenset(
    n for n in USER_TOOL_NAMES if n.startswith("check_") or n in ("run_speed_test", "can_send_mms"))
USER_WRITE_TOOLS: frozenset[str] = frozenset(USER_TOOL_NAMES) - USER_READ_TOOLS
"""The 15 user tools that change the phone (the ones tau2's evaluator replays)."""
USER_ENV_FUNCTIONS: frozenset[str] = frozenset({
    "set_user_info", "set_user_location", "turn_airplane_mode_on", "turn_airplane_mode_off", "unseat_sim_card",
    "lock_sim_card", "turn_data_off", "turn_data_on", "turn_roaming_on", "turn_roaming_off",
    "turn_data_saver_mode_on", "turn_data_saver_mode_off", "break_apn_settings", "break_apn_mms_setting",
    "set_wifi_calling", "break_vpn", "remove_app_permission", "simulate_network_search",
    "assert_airplane_mode_status", "assert_service_status", "assert_mobile_data_status",
    "assert_mobile_roaming_status", "assert_mobile_data_saver_mode_status", "assert_internet_speed",
    "assert_internet_not_excellent", "assert_can_send_mms", "assert_mobile_data_usage_exceeded"})
"""tau2's non-tool methods of ``TelecomUserTools`` (same names and parameters here), which
initialization actions and env assertions call; a user tool call naming one is "not found"."""

PYDANTIC_REFERENCE_VERSION = "2.14"
"""The pydantic version of the tau2 run the specification was checked against; validation errors name
it in their documentation link."""
_ERROR_LINK = re.compile(r"(For further information visit https://errors\.pydantic\.dev/)[^/\s]+(/v/)")


# --------------------------------------------------------------------------------------------------
# tau2's enums and the one record a tool validates

class NetworkModePreference(str, enum.Enum):
    FOUR_G_5G_PREFERRED = "4g_5g_preferred"
    FOUR_G_ONLY = "4g_only"
    THREE_G_ONLY = "3g_only"
    TWO_G_ONLY = "2g_only"


class NetworkStatus(str, enum.Enum):
    CONNECTED = "connected"
    SEARCHING = "searching"
    NO_SERVICE = "no_service"
    EMERGENCY_ONLY = "emergency_only"


class PerformanceLevel(str, enum.Enum):
    UNKNOWN = "unknown"
    POOR = "poor"
    FAIR = "fair"
    GOOD = "good"
    EXCELLENT = "excellent"


class APNNames(str, enum.Enum):
    INTERNET = "internet"
    BROKEN = "broken"


class APNSettings(pydantic.BaseModel):
    """Represents the configuration for a single Access Point Name (APN)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    apn_name: APNNames = pydantic.Field(APNNames.INTERNET, description="The name identifier for the APN connection.")
    reset_at_reboot: bool = pydantic.Field(
        False, description="Whether the APN settings will be reset at the next reboot.")
    mms_apn: str | None = pydantic.Field(
        "mms", description="Specific APN name used for MMS traffic, if different from general data.")
    mmsc_url: str | None = pydantic.Field(
        "http://mms.carrier.com/mms/wapenc",
        description="The URL of the Multimedia Messaging Service Center (MMSC). Crucial for MMS.")
    mms_proxy: str | None = pydantic.Field(
        None, description="The proxy server address required for MMS traffic on some networks.")
    mms_port: int | None = pydantic.Field(
        None, description="The proxy server port required for MMS traffic on some networks.")


SIM_STATUSES: tuple[str, ...] = ("active", "missing", "locked_pin", "locked_puk")
SIGNAL_STRENGTHS: tuple[str, ...] = ("none", "poor", "fair", "good", "excellent")
NETWORK_TECHNOLOGIES: tuple[str, ...] = ("none", "2G", "3G", "4G", "5G")
NETWORK_MODES: tuple[str, ...] = tuple(m.value for m in NetworkModePreference)
PERMISSIONS: tuple[str, ...] = ("sms", "storage", "phone", "network")
"""An app's tracked permissions, in tau2's field order (the order texts list them in)."""

APN_FIELDS: tuple[str, ...] = tuple(APNSettings.model_fields)
VPN_FIELDS: tuple[str, ...] = ("server_address", "protocol", "server_performance")
PAYMENT_REQUEST_FIELDS: tuple[str, ...] = ("bill_id", "amount_due", "paid")


def default_apn_settings() -> dict:
    """A fresh copy of tau2's default APN settings ("Default APN settings" of spec 4.1)."""
    return APNSettings().model_dump(mode="json")


def _default_apps() -> dict:
    return {"messaging": {"app_name": "messaging",
                          "permissions": {"sms": True, "storage": True, "phone": True, "network": False}},
            "browser": {"app_name": "browser",
                        "permissions": {"sms": False, "storage": True, "phone": False, "network": True}}}


def _default_device() -> dict:
    """tau2's ``MockPhoneAttributes`` defaults, in its field order."""
    return {"sim_card_status": "active", "sim_card_missing": False, "airplane_mode": False,
            "network_signal_strength": "good", "network_technology_connected": "5G",
            "network_connection_status": "connected", "battery_level": 80, "data_enabled": True,
            "roaming_enabled": False, "network_mode_preference": "4g_5g_preferred",
            "active_apn_settings": default_apn_settings(), "wifi_enabled": False, "wifi_connected": False,
            "wifi_ssid": None, "wifi_signal_strength": "none", "wifi_calling_enabled": False,
            "wifi_calling_mms_over_wifi": False, "data_saver_mode": False, "vpn_enabled_setting": False,
            "vpn_connected": False, "vpn_details": None, "app_statuses": _default_apps()}


def _default_surroundings() -> dict:
    """tau2's ``UserSurroundings`` defaults, in its field order."""
    return {"name": None, "phone_number": None, "is_abroad": False, "roaming_allowed": False,
            "signal_strength": {"2G": "poor", "3G": "fair", "4G": "good", "5G": "excellent"},
            "mobile_data_usage_exceeded": False, "line_active": True, "payment_request": None}


DEVICE_FIELDS: tuple[str, ...] = tuple(_default_device())
"""The 22 device fields in tau2's canonical order (spec 4.1)."""
SURROUNDINGS_FIELDS: tuple[str, ...] = tuple(_default_surroundings())
"""The 8 surroundings fields in tau2's canonical order (spec 4.1)."""


# --------------------------------------------------------------------------------------------------
# loading and validating the user DB

def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _is_opt_str(v: Any) -> bool:
    return v is None or type(v) is str


def _one_of(values: tuple[str, ...]) -> tuple[Any, str]:
    return (lambda v: type(v) is str and v in values), "one of " + ", ".join(map(repr, values))


_BOOL = (_is_bool, "a boolean")
_OPT_STR = (_is_opt_str, "a string or absent (null)")
_DEVICE_CHECKS: dict[str, tuple[Any, str]] = {
    "sim_card_status": _one_of(SIM_STATUSES), "sim_card_missing": _BOOL, "airplane_mode": _BOOL,
    "network_signal_strength": _one_of(SIGNAL_STRENGTHS),
    "network_technology_connected": _one_of(NETWORK_TECHNOLOGIES),
    "network_connection_status": _one_of(tuple(s.value for s in NetworkStatus)),
    "battery_level": ((lambda v: type(v) is int), "an integer"), "data_enabled": _BOOL, "roaming_enabled": _BOOL,
    "network_mode_preference": _one_of(NETWORK_MODES), "wifi_enabled": _BOOL, "wifi_connected": _BOOL,
    "wifi_ssid": _OPT_STR, "wifi_signal_strength": _one_of(SIGNAL_STRENGTHS), "wifi_calling_enabled": _BOOL,
    "wifi_calling_mms_over_wifi": _BOOL, "data_saver_mode": _BOOL, "vpn_enabled_setting": _BOOL,
    "vpn_connected": _BOOL}
_APN_CHECKS: dict[str, tuple[Any, str]] = {
    "apn_name": _one_of(tuple(n.value for n in APNNames)), "reset_at_reboot": _BOOL, "mms_apn": _OPT_STR,
    "mmsc_url": _OPT_STR, "mms_proxy": _OPT_STR,
    "mms_port": ((lambda v: v is None or type(v) is int), "an integer or absent (null)")}
_VPN_CHECKS: dict[str, tuple[Any, str]] = {
    "server_address": _OPT_STR, "protocol": _OPT_STR,
    "server_performance": _one_of(tuple(p.value for p in PerformanceLevel))}
_SURROUNDINGS_CHECKS: dict[str, tuple[Any, str]] = {
    "name": _OPT_STR, "phone_number": _OPT_STR, "is_abroad": _BOOL, "roaming_allowed": _BOOL,
    "mobile_data_usage_exceeded": _BOOL, "line_active": _BOOL}


def _table(raw: Any, where: str, defaults: dict, checks: dict[str, tuple[Any, str]]) -> dict:
    """``defaults`` overridden by the table ``raw`` (an object with known keys only), each value checked."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is {_describe(raw)}; expected a table with fields {list(defaults)}")  # noqa: TRY004
    unknown = [k for k in raw if k not in defaults]
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {unknown}; expected fields among {list(defaults)}")
    out = dict(defaults)
    for key, value in raw.items():
        if key in checks:
            ok, expected = checks[key]
            if not ok(value):
                raise ValueError(f"{where}: field {key!r} is {_describe(value)}; expected {expected}")
        out[key] = value
    return out


def canonicalize_user_db(raw: Any, source: str = "user_db") -> dict:
    """Validate a parsed ``user_db.toml`` and return the user DB in canonical form (module docstring).

    The file holds a ``[device]`` table and optionally ``[surroundings]``; omitted fields take tau2's
    model defaults. Values must have their exact types (no coercion). Raises ``ValueError`` naming the
    file, the field and what was expected.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"{source}: expected a table with keys ['device', 'surroundings']")  # noqa: TRY004
    unknown = [k for k in raw if k not in ("device", "surroundings")]
    if unknown:
        raise ValueError(f"{source}: unknown top-level key(s) {unknown}; expected 'device' and optionally "
                         "'surroundings'")
    device = _table(raw.get("device", {}), f"{source}: device", _default_device(), _DEVICE_CHECKS)
    device["active_apn_settings"] = _table(device["active_apn_settings"], f"{source}: device.active_apn_settings",
                                           default_apn_settings(), _APN_CHECKS)
    if device["vpn_details"] is not None:
        device["vpn_details"] = _table(device["vpn_details"], f"{source}: device.vpn_details",
                                       {"server_address": None, "protocol": None, "server_performance": "unknown"},
                                       _VPN_CHECKS)
    apps = device["app_statuses"]
    if not isinstance(apps, dict):
        message = (f"{source}: device: field 'app_statuses' is {_describe(apps)}; expected a table mapping app "
                   "names to {app_name, permissions}")
        raise ValueError(message)  # noqa: TRY004
    statuses = {}
    for name, app in apps.items():
        where = f"{source}: device.app_statuses.{name}"
        app = _table(app, where, {"app_name": None, "permissions": {}}, {"app_name": (
            lambda v: type(v) is str, "a string")})
        if app["app_name"] is None:
            raise ValueError(f"{where}: missing field 'app_name'; expected a string")
        app["permissions"] = _table(app["permissions"], f"{where}.permissions", dict.fromkeys(PERMISSIONS, False),
                                    dict.fromkeys(PERMISSIONS, _BOOL))
        statuses[name] = app
    device["app_statuses"] = statuses
    surroundings = _table(raw.get("surroundings", {}), f"{source}: surroundings", _default_surroundings(),
                          _SURROUNDINGS_CHECKS)
    signals = surroundings["signal_strength"]
    if not isinstance(signals, dict) or not all(
            k in NETWORK_TECHNOLOGIES and v in SIGNAL_STRENGTHS for k, v in signals.items()):
        raise ValueError(f"{source}: surroundings: field 'signal_strength' is {_describe(signals)}; expected a "
                         f"table mapping technologies {list(NETWORK_TECHNOLOGIES)} to signal strengths "
                         f"{list(SIGNAL_STRENGTHS)}")
    request = surroundings["payment_request"]
    if request is not None:
        request = _table(request, f"{source}: surroundings.payment_request",
                         {"bill_id": None, "amount_due": None, "paid": False},
                         {"bill_id": ((lambda v: type(v) is str), "a string"),
                          "amount_due": ((lambda v: type(v) in (int, float)), "a number"), "paid": _BOOL})
        if request["bill_id"] is None or request["amount_due"] is None:
            raise ValueError(f"{source}: surroundings.payment_request: fields 'bill_id' and 'amount_due' are "
                             "required")
        request["amount_due"] = float(request["amount_due"])   # pydantic's float field
        surroundings["payment_request"] = request
    return {"device": device, "surroundings": surroundings}



def load_user_db(data_dir: str | Path | None = None) -> dict:
    """A fresh, independent user DB from ``<data_dir>/user_db.toml`` (default: the packaged copy).

    The file is parsed and validated once per path (and size/modification time); every call returns a
    new deep copy, so tools may mutate it freely (`jaxagent.envs.tau2.db.load_canonical`). A missing
    file raises ``FileNotFoundError`` naming the config key (`jaxagent.envs.tau2.db.data_file`); a
    malformed one ``ValueError``.
    """
    path = data_file(data_dir, DEFAULT_DATA_DIR, USER_DB_FILE, domain="telecom", holds=(USER_DB_FILE,))
    return load_canonical(path, canonicalize_user_db, parse=parse_toml)


# --------------------------------------------------------------------------------------------------
# the connectivity model (spec 4.2)

_TECH_SPEEDS: dict[str, tuple[float, float]] = {
    "2G": (0.1, 0.4), "3G": (1.0, 5.0), "4G": (10.0, 100.0), "5G": (50.0, 500.0), "none": (0.0, 0.0)}
_SIGNAL_FACTORS: dict[str, float] = {"poor": 0.2, "fair": 0.5, "good": 0.8, "excellent": 1.0, "none": 0.0}
_SIGNAL_ICONS: dict[str, str] = {"none": "📵 No Signal", "poor": "📶¹ Poor", "fair": "📶² Fair",
                                 "good": "📶³ Good", "excellent": "📶⁴ Excellent"}
_SPEED_ADVICE: dict[str, str] = {
    "Very Poor": "Connection is very slow. Basic web browsing might be difficult.",
    "Poor": "Connection is slow. Web browsing may be sluggish, streaming difficult.",
    "Fair": "Connection is okay for web browsing and some standard definition streaming.",
    "Good": "Connection is good for most activities, including HD streaming.",
    "Excellent": "Connection is very fast."}


def _apn(device: dict, attribute: str) -> dict:
    """The APN settings record; when ``set_apn_settings`` stored a value that is not an object (as tau2
    does), Python's error for reading or writing ``attribute`` on it."""
    apn = device["active_apn_settings"]
    if not isinstance(apn, dict):
        raise AttributeError(f"'{type(apn).__name__}' object has no attribute '{attribute}'")  # noqa: TRY004
    return apn


def sim_status(user_db: dict) -> str:
    """``missing`` if the SIM is out, else the SIM card status."""
    device = user_db["device"]
    return "missing" if device["sim_card_missing"] else device["sim_card_status"]


def _no_service(device: dict) -> None:
    device["network_connection_status"] = "no_service"
    device["network_technology_connected"] = "none"
    device["network_signal_strength"] = "none"


def network_search(user_db: dict) -> None:
    """tau2's ``simulate_network_search``: connection status, technology and signal from the SIM, the
    preference and the surroundings' signals; then airplane mode, a broken APN and an inactive line each
    force no service (spec 4.2)."""
    device, surroundings = user_db["device"], user_db["surroundings"]
    if sim_status(user_db) == "active":
        device["network_connection_status"] = "connected"
        signals = surroundings["signal_strength"]
        pref = device["network_mode_preference"]
        if pref == "4g_5g_preferred":
            tech = "4G" if signals.get("5G", "none") == "none" else "5G"
        elif pref == "3g_only":
            tech = "3G"
        elif pref == "2g_only":
            tech = "2G"
        else:   # 4g_only and anything that is not a preference
            tech = "4G"
        device["network_technology_connected"] = tech
        device["network_signal_strength"] = signals.get(tech, "none")
    else:
        _no_service(device)
    if device["airplane_mode"]:
        _no_service(device)
    if _apn(device, "apn_name")["apn_name"] == "broken":
        _no_service(device)
    if not surroundings["line_active"]:
        _no_service(device)


def mobile_data_working(user_db: dict) -> bool:
    """Whether mobile data works, from the stored device fields (stale until a search)."""
    device, surroundings = user_db["device"], user_db["surroundings"]
    if device["airplane_mode"] or device["network_signal_strength"] == "none":
        return False
    if device["network_connection_status"] == "no_service":
        return False
    if surroundings["is_abroad"] and (not device["roaming_enabled"] or not surroundings["roaming_allowed"]):
        return False
    if not device["data_enabled"]:
        return False
    return not surroundings["mobile_data_usage_exceeded"]


def speed_test(user_db: dict) -> tuple[float | None, str]:
    """``(speed in Mbps, label)``, or ``(None, "No Connection")`` when mobile data is not working."""
    if not mobile_data_working(user_db):
        return None, "No Connection"
    device = user_db["device"]
    vpn = device["vpn_details"]
    factor = 0.1 if device["vpn_connected"] and vpn and vpn["server_performance"] == "poor" else 1.0
    if device["data_saver_mode"]:
        factor *= 0.2
    low, high = _TECH_SPEEDS.get(device["network_technology_connected"], (0.0, 0.0))
    signal = _SIGNAL_FACTORS.get(device["network_signal_strength"], 0.0)
    speed = round((low + high) / 2.0 * signal * factor, 2)
    if speed < 1:
        return speed, "Very Poor"
    if speed < 5:
        return speed, "Poor"
    if speed < 25:
        return speed, "Fair"
    if speed < 100:
        return speed, "Good"
    return speed, "Excellent"


def can_send_mms(user_db: dict) -> bool:
    """Whether the messaging app can send MMS: data working, not 2G, not MMS over Wi-Fi calling, an
    MMSC URL, and a ``messaging`` app with the sms and storage permissions."""
    device = user_db["device"]
    if not mobile_data_working(user_db):
        return False
    if device["network_technology_connected"] == "2G":
        return False
    if device["wifi_calling_enabled"] and device["wifi_calling_mms_over_wifi"]:
        return False
    if _apn(device, "mmsc_url")["mmsc_url"] is None:
        return False
    app = device["app_statuses"].get("messaging")
    if app is None:
        return False
    return app["permissions"]["storage"] and app["permissions"]["sms"]


def status_bar_text(user_db: dict) -> str:
    """The status bar's icons joined by ``" | "`` (spec 4.2)."""
    device = user_db["device"]
    parts = []
    if device["airplane_mode"]:
        parts.append("✈️ Airplane Mode")
    else:
        parts.append(_SIGNAL_ICONS.get(device["network_signal_strength"], "📵 No Signal"))
        tech = device["network_technology_connected"]
        if tech != "none":
            parts.append(tech)
        if device["data_enabled"] and tech != "none":
            parts.append("📱 Data Enabled")
            if device["data_saver_mode"]:
                parts.append("🔽 Data Saver")
        else:
            parts.append("📵 Data Disabled")
    if device["wifi_enabled"] and device["wifi_connected"]:
        parts.append(f"📡 Connected to {device['wifi_ssid']}" if device["wifi_ssid"] else "📡 Enabled")
    if device["vpn_connected"]:
        parts.append("🔒 VPN Connected")
    parts.append(f"🔋 {device['battery_level']}%")
    return " | ".join(parts)


# --------------------------------------------------------------------------------------------------
# the user's toolkit

class TelecomUserTools:
    """tau2's telecom user toolkit over a user DB (mutated in place)."""

    def __init__(self, user_db: dict) -> None:
        self.db = user_db

    @property
    def device(self) -> dict:
        return self.db["device"]

    @property
    def surroundings(self) -> dict:
        return self.db["surroundings"]

    def _bar(self, text: str) -> str:
        return f"{text}\nStatus Bar: {status_bar_text(self.db)}"

    # -- non-tool functions (spec 4.4) ------------------------------------------------------------------

    def set_user_info(self, name: str, phone_number: str) -> None:
        """Sets the surroundings' name and phone number."""
        self.surroundings["name"] = copy.deepcopy(name)
        self.surroundings["phone_number"] = copy.deepcopy(phone_number)

    def set_user_location(self, abroad: bool) -> None:
        """Sets whether the user is abroad (stored as given)."""
        self.surroundings["is_abroad"] = copy.deepcopy(abroad)

    def simulate_network_search(self) -> None:
        """A network search (:func:`network_search`)."""
        network_search(self.db)

    def turn_airplane_mode_on(self) -> str:
        """Toggles, and toggles again when that turned it off."""
        if not self._toggle_airplane_mode():
            self._toggle_airplane_mode()
        return "Airplane Mode is now ON."

    def turn_airplane_mode_off(self) -> str:
        """Toggles, and toggles again when that turned it on."""
        if self._toggle_airplane_mode():
            self._toggle_airplane_mode()
        return "Airplane Mode is now OFF."

    def unseat_sim_card(self) -> str:
        """Takes the SIM out, then a search."""
        self.device["sim_card_missing"] = True
        network_search(self.db)
        return "SIM card un-seated successfully."

    def lock_sim_card(self, mode: str) -> str:
        """``pin`` -> ``locked_pin``, ``puk`` -> ``locked_puk`` (anything else changes nothing), then a search."""
        if mode == "pin":
            self.device["sim_card_status"] = "locked_pin"
        elif mode == "puk":
            self.device["sim_card_status"] = "locked_puk"
        network_search(self.db)
        return f"SIM card locked successfully in {mode} mode."

    def turn_data_off(self) -> str:
        """Toggles data (with a search), and again when that turned it on."""
        if self._toggle_data():
            self._toggle_data()
        return "Data connection broken."

    def turn_data_on(self) -> str:
        """Sets data on, without a search."""
        self.device["data_enabled"] = True
        return "Data connection restored."

    def turn_roaming_on(self) -> str:
        """Toggles roaming (with a search), and again when that turned it off."""
        if not self._toggle_roaming():
            self._toggle_roaming()
        return "Data Roaming is now ON."

    def turn_roaming_off(self) -> str:
        """Toggles roaming (with a search), and again when that turned it on."""
        if self._toggle_roaming():
            self._toggle_roaming()
        return "Data Roaming is now OFF."

    def turn_data_saver_mode_on(self) -> str:
        """Data saver on (no search)."""
        if not self._toggle_data_saver_mode():
            self._toggle_data_saver_mode()
        return "Data Saver Mode is now ON."

    def turn_data_saver_mode_off(self) -> str:
        """Data saver off (no search)."""
        if self._toggle_data_saver_mode():
            self._toggle_data_saver_mode()
        return "Data Saver Mode is now OFF."

    def break_apn_settings(self) -> str:
        """APN name ``broken``, then a search (no service)."""
        _apn(self.device, "apn_name")["apn_name"] = "broken"
        network_search(self.db)
        return "APN settings broken. Please call reset_apn_settings() to fix."

    def break_apn_mms_setting(self) -> str:
        """Clears the MMSC URL (no search)."""
        _apn(self.device, "mmsc_url")["mmsc_url"] = None
        return "APN MMS setting broken. Please call reset_apn_settings() to fix."

    def set_wifi_calling(self, enabled: bool, mms_over_wifi: bool | None = None) -> str:
        """Wi-Fi calling toggled when it differs from ``enabled``; MMS over Wi-Fi set only when given."""
        if self.device["wifi_calling_enabled"] != enabled:
            self._toggle_wifi_calling()
        message = f"Wi-Fi Calling is now {'ON' if enabled else 'OFF'}."
        if mms_over_wifi is not None:
            self.device["wifi_calling_mms_over_wifi"] = copy.deepcopy(mms_over_wifi)
            message += f"\nMMS over Wi-Fi is now {'ON' if mms_over_wifi else 'OFF'}."
        return message

    def break_vpn(self) -> str:
        """``connect_vpn``, then the connection's performance becomes ``poor`` (this phone's details only)."""
        self.connect_vpn()
        details = self.device["vpn_details"]
        if details is None:
            raise AttributeError("'NoneType' object has no attribute 'server_performance'")
        details["server_performance"] = "poor"
        return "VPN connection broken."

    def remove_app_permission(self, app_name: str, permission: str) -> tuple[bool, str]:
        """Sets an app's permission false; tau2's ``(success, message)``."""
        app = self.device["app_statuses"].get(app_name)
        permission = permission.lower()
        if app is None:
            return False, f"App '{app_name}' not found. Cannot remove permission."
        if permission not in PERMISSIONS:
            return False, f"Permission '{permission}' not tracked for app '{app_name}'."
        app["permissions"][permission] = False
        return True, f"Permission '{permission}' removed from app '{app_name}'."

    # -- assertions (spec 4.4) ---------------------------------------------------------------------------

    def assert_airplane_mode_status(self, expected_status: bool) -> bool:
        return self.device["airplane_mode"] == expected_status

    def assert_service_status(self, expected_status: str) -> bool:
        """Connection status equals ``expected_status`` (a ``NetworkStatus`` value, else Python's error)."""
        return self.device["network_connection_status"] == NetworkStatus(expected_status).value

    def assert_mobile_data_status(self, expected_status: bool) -> bool:
        return mobile_data_working(self.db) == expected_status

    def assert_mobile_roaming_status(self, expected_status: bool) -> bool:
        return self.device["roaming_enabled"] == expected_status

    def assert_mobile_data_saver_mode_status(self, expected_status: bool) -> bool:
        return self.device["data_saver_mode"] == expected_status

    def assert_internet_speed(self, expected_speed: float, expected_desc: str | None = None) -> bool:
        """Speed (0.0 without connection) at least ``expected_speed``, and the label equal ignoring case
        when given."""
        speed, desc = speed_test(self.db)
        speed = speed or 0.0
        if expected_desc is None:
            return speed >= expected_speed
        return speed >= expected_speed and desc.lower() == expected_desc.lower()

    def assert_internet_not_excellent(self) -> bool:
        return speed_test(self.db)[1].lower() != "excellent"

    def assert_can_send_mms(self, expected_status: bool) -> bool:
        return can_send_mms(self.db) == expected_status

    def assert_mobile_data_usage_exceeded(self, expected_status: bool) -> bool:
        return self.surroundings["mobile_data_usage_exceeded"] == expected_status

    # -- helpers ----------------------------------------------------------------------------------------

    def _toggle_airplane_mode(self) -> bool:
        device = self.device
        was_on = device["airplane_mode"]
        device["airplane_mode"] = not was_on
        if was_on:
            device["network_connection_status"] = "searching"
            if device["wifi_enabled"]:
                self._wifi_disconnect()
        else:
            self._wifi_disconnect()
            self._disconnect_vpn()
        network_search(self.db)
        return device["airplane_mode"]

    def _wifi_disconnect(self) -> None:
        self.device.update(wifi_connected=False, wifi_ssid=None, wifi_signal_strength="none")

    def _toggle_data(self) -> bool:
        self.device["data_enabled"] = not self.device["data_enabled"]
        network_search(self.db)
        return self.device["data_enabled"]

    def _toggle_roaming(self) -> bool:
        self.device["roaming_enabled"] = not self.device["roaming_enabled"]
        network_search(self.db)
        return self.device["roaming_enabled"]

    def _toggle_data_saver_mode(self) -> bool:
        self.device["data_saver_mode"] = not self.device["data_saver_mode"]
        return self.device["data_saver_mode"]

    def _toggle_wifi_calling(self) -> bool:
        self.device["wifi_calling_enabled"] = not self.device["wifi_calling_enabled"]
        return self.device["wifi_calling_enabled"]

    def _disconnect_vpn(self) -> bool:
        if not self.device["vpn_connected"]:
            return False
        self.device["vpn_connected"] = False
        self.device["vpn_details"] = None
        return True

    # -- the 30 user tools (spec 4.3), in tau2's order --------------------------------------------------

    def check_status_bar(self) -> str:
        return f"Status Bar: {status_bar_text(self.db)}"

    def check_network_status(self) -> str:
        """Nine lines (ten with a connected Wi-Fi)."""
        d = self.device
        lines = [f"Airplane Mode: {'ON' if d['airplane_mode'] else 'OFF'}",
                 f"SIM Card Status: {sim_status(self.db)}",
                 f"Cellular Connection: {d['network_connection_status']}",
                 f"Cellular Signal: {d['network_signal_strength']}",
                 f"Cellular Network Type: {d['network_technology_connected']}",
                 f"Mobile Data Enabled: {'Yes' if d['data_enabled'] else 'No'}",
                 f"Data Roaming Enabled: {'Yes' if d['roaming_enabled'] else 'No'}",
                 f"Wi-Fi Radio: {'ON' if d['wifi_enabled'] else 'OFF'}",
                 f"Wi-Fi Connected: {'Yes' if d['wifi_connected'] else 'No'}"]
        if d["wifi_connected"]:
            lines.append(f"Connected Wi-Fi Network: {d['wifi_ssid']}")
        return "\n".join(lines)

    def check_network_mode_preference(self) -> str:
        pref = self.device["network_mode_preference"]
        if not isinstance(pref, str):   # stored unvalidated by set_network_mode_preference, as in tau2
            raise AttributeError(f"'{type(pref).__name__}' object has no attribute 'value'")  # noqa: TRY004
        return f"Network Mode Preference: {pref}"

    def set_network_mode_preference(self, mode: NetworkModePreference | str) -> str:
        """One of the four modes: stored, then a search; another string: a failure text, nothing changed;
        None: stored, a search, then the failure text (tau2's helper returns None, read as "invalid");
        another non-string: stored as given, a search, then Python's error (tau2's)."""
        if mode is None:
            self.device["network_mode_preference"] = None
            network_search(self.db)
            return self._bar(f"Failed to set network mode: 'None' is not a valid option. Please use one "
                             f"of: {', '.join(NETWORK_MODES)}")
        if isinstance(mode, str):
            if mode not in NETWORK_MODES:
                return self._bar(f"Failed to set network mode: '{mode}' is not a valid option. Please use one "
                                 f"of: {', '.join(NETWORK_MODES)}")
            self.device["network_mode_preference"] = mode
        else:
            self.device["network_mode_preference"] = copy.deepcopy(mode)
        network_search(self.db)
        if not isinstance(mode, str):
            raise AttributeError(f"'{type(mode).__name__}' object has no attribute 'value'")  # noqa: TRY004
        return self._bar(f"Preferred Network Mode set to: {mode}")

    def run_speed_test(self) -> str:
        speed, label = speed_test(self.db)
        if speed is None:
            return f"Speed test failed: {label}."
        return f"Speed Test Result: {speed:.2f} Mbps ({label}). {_SPEED_ADVICE[label]}"

    def toggle_airplane_mode(self) -> str:
        """Turning on drops Wi-Fi and the VPN; turning off drops Wi-Fi when enabled; then a search."""
        on = self._toggle_airplane_mode()
        return self._bar(f"Airplane Mode is now {'ON' if on else 'OFF'}.")

    def check_sim_status(self) -> str:
        status = sim_status(self.db)
        return {"active": "Your SIM card is active and working.",
                "missing": "No SIM card detected in the phone.",
                "locked_pin": "The SIM card is locked with a PIN code.",
                "locked_puk": "The SIM card is locked with a PUK code."}.get(status, f"Unknown SIM status: {status}")

    def reseat_sim_card(self) -> str:
        """SIM back in (a PIN/PUK lock stays), then a search."""
        self.device["sim_card_missing"] = False
        network_search(self.db)
        return self._bar("SIM card re-seated successfully.")

    def toggle_data(self) -> str:
        on = self._toggle_data()
        return self._bar(f"Mobile Data is now {'ON' if on else 'OFF'}.")

    def toggle_roaming(self) -> str:
        on = self._toggle_roaming()
        return self._bar(f"Data Roaming is now {'ON' if on else 'OFF'}.")

    def check_data_restriction_status(self) -> str:
        if self.device["data_saver_mode"]:
            return "Data Saver mode is ON (limits data usage)."
        return "Data Saver mode is OFF."

    def toggle_data_saver_mode(self) -> str:
        """No search."""
        on = self._toggle_data_saver_mode()
        return self._bar(f"Data Saver Mode is now {'ON' if on else 'OFF'}.")

    def check_apn_settings(self) -> str:
        apn = _apn(self.device, "model_copy")
        return (f"Current APN Name: {apn['apn_name'] or 'Not Set'}\n"
                f"MMSC URL (for picture messages): {apn['mmsc_url'] or 'Not Set'}\n"
                "(These are technical settings, usually best left unchanged.)")

    def set_apn_settings(self, apn_settings: APNSettings | dict) -> str:
        """An object is validated by :class:`APNSettings` (missing fields take the defaults) and replaces
        the settings; then a search."""
        if isinstance(apn_settings, dict):
            try:
                settings = APNSettings(**apn_settings).model_dump(mode="json")
            except pydantic.ValidationError as exc:
                raise ToolError(_ERROR_LINK.sub(rf"\g<1>{PYDANTIC_REFERENCE_VERSION}\g<2>", str(exc))) from None
        else:   # tau2 stores it unvalidated, then fails reading its name
            self.device["active_apn_settings"] = copy.deepcopy(apn_settings)
            raise AttributeError(f"'{type(apn_settings).__name__}' object has no attribute 'apn_name'")  # noqa: TRY004
        self.device["active_apn_settings"] = settings
        network_search(self.db)
        return self._bar(f"APN settings set to: {settings['apn_name']}")

    def reset_apn_settings(self) -> str:
        """Only marks the settings to reset at the next reboot; then a search."""
        _apn(self.device, "reset_at_reboot")["reset_at_reboot"] = True
        network_search(self.db)
        return self._bar("APN settings will reset at reboot.")

    def check_wifi_status(self) -> str:
        d = self.device
        if not d["wifi_enabled"]:
            return "Wi-Fi is turned OFF."
        if d["wifi_connected"]:
            return f"Wi-Fi is ON and connected to '{d['wifi_ssid']}'. Signal strength: {d['wifi_signal_strength']}."
        return "Wi-Fi is ON but not connected to any network."

    def toggle_wifi(self) -> str:
        """Refused in airplane mode; turning off drops the connection. No search."""
        if self.device["airplane_mode"]:
            return self._bar("Cannot change Wi-Fi settings while Airplane Mode is ON.")
        on = not self.device["wifi_enabled"]
        self.device["wifi_enabled"] = on
        if not on:
            self._wifi_disconnect()
        return self._bar(f"Wi-Fi is now {'ON' if on else 'OFF'}.")

    def check_wifi_calling_status(self) -> str:
        return f"Wi-Fi Calling is currently turned {'ON' if self.device['wifi_calling_enabled'] else 'OFF'}."

    def toggle_wifi_calling(self) -> str:
        """MMS over Wi-Fi untouched."""
        on = self._toggle_wifi_calling()
        return self._bar(f"Wi-Fi Calling is now {'ON' if on else 'OFF'}.")

    def check_vpn_status(self) -> str:
        """The details as tau2 prints its model dump: a dict repr, the performance an enum repr."""
        d = self.device
        if d["vpn_connected"]:
            details = d["vpn_details"]
            if details:
                shown = {k: details[k] for k in VPN_FIELDS}
                shown["server_performance"] = PerformanceLevel(shown["server_performance"])
                return f"VPN is ON and connected. Details: {shown}"
            return "VPN is ON and connected (no specific details available)."
        if d["vpn_enabled_setting"]:
            return "VPN is turned ON in settings, but currently not connected."
        return "VPN is turned OFF."

    def connect_vpn(self) -> str:
        """A fresh excellent OpenVPN connection to 192.168.1.1 (no status bar when already connected)."""
        if self.device["vpn_connected"]:
            return "VPN already connected."
        self.device["vpn_connected"] = True
        self.device["vpn_details"] = {"server_address": "192.168.1.1", "protocol": "OpenVPN",
                                      "server_performance": "excellent"}
        return self._bar("VPN connected successfully.")

    def disconnect_vpn(self) -> str:
        if self._disconnect_vpn():
            return self._bar("VPN disconnected successfully.")
        return self._bar("No active VPN connection to disconnect.")

    def check_installed_apps(self) -> str:
        return f"The following apps are installed on the phone: {', '.join(self.device['app_statuses'])}"

    def check_app_status(self, app_name: str) -> str:
        app = self.device["app_statuses"].get(app_name)
        if app is None:
            return f"App '{app_name}' not found on this phone."
        granted = [p for p in PERMISSIONS if app["permissions"][p]]
        lines = [f"Status for App: {app_name}"]
        if granted:
            lines.append(" - Permissions Granted:")
            lines.extend(f"   - {p}" for p in granted)
        else:
            lines.append(" - Permissions: None granted.")
        return "\n".join(lines)

    def check_app_permissions(self, app_name: str) -> str:
        app = self.device["app_statuses"].get(app_name)
        if app is None:
            return f"App '{app_name}' not found on this phone."
        granted = [p for p in PERMISSIONS if app["permissions"][p]]
        if not granted:
            return f"App '{app_name}' currently has no permissions granted."
        return f"App '{app_name}' has permission for: {', '.join(granted)}."

    def grant_app_permission(self, app_name: str, permission: str) -> str:
        """``permission`` lower-cased; failures are ordinary texts (``Error. ...``), not errors."""
        app = self.device["app_statuses"].get(app_name)
        permission = permission.lower()
        if app is None:
            message = f"Error. App '{app_name}' not found. Cannot grant permission."
        elif permission not in PERMISSIONS:
            message = (f"Error. Permission '{permission}' not tracked for app '{app_name}', available permissions: "
                       f"{list(PERMISSIONS)}")
        else:
            app["permissions"][permission] = True
            message = f"Success. Permission '{permission}' granted to app '{app_name}'."
        return self._bar(message)

    def can_send_mms(self) -> str:
        if can_send_mms(self.db):   # the module function (methods do not see the class namespace)
            return "Your messaging app can send MMS messages."
        return "Your messaging app cannot send MMS messages."

    def reboot_device(self) -> str:
        """APN defaults when marked to reset, then status ``searching`` and a search."""
        lines = []
        if _apn(self.device, "reset_at_reboot")["reset_at_reboot"]:
            lines.append("Resetting APN settings...")
            self.device["active_apn_settings"] = default_apn_settings()
        lines.append("Restarting network services...")
        self.device["network_connection_status"] = "searching"
        network_search(self.db)
        return self._bar("\n".join(lines))

    def check_payment_request(self) -> str:
        request = self.surroundings["payment_request"]
        if request is None:
            return "No payment request has been made."
        return f"You have a payment request for bill {request['bill_id']} of {request['amount_due']} USD."

    def make_payment(self) -> str:
        """Marks the request paid; the bill becomes Paid at the next sync."""
        request = self.surroundings["payment_request"]
        if request is None:
            return "You do not have a payment request."
        request["paid"] = True
        return f"Payment of {request['amount_due']} USD has been made for bill {request['bill_id']}."


# --------------------------------------------------------------------------------------------------
# calling a user tool

def execute_user(user_db: dict, name: str, arguments: Any) -> ToolResult:
    """Run one user tool call against ``user_db`` (mutated in place by write tools); never raises
    (`jaxagent.envs.tau2.tools.run_tool`: a name outside :data:`USER_TOOL_NAMES`, environment functions
    included, is ``Error: Tool '<name>' not found.``). No sync here."""
    return run_tool(TelecomUserTools(user_db), USER_TOOL_NAMES, name, arguments)


# --------------------------------------------------------------------------------------------------
# schemas shown to the user simulator: tau2's own, from the packaged file

_APN_REF = {"anyOf": [{"$ref": "#/$defs/APNSettings"}, {"additionalProperties": True, "type": "object"}]}
_MODE_REF = {"anyOf": [{"$ref": "#/$defs/NetworkModePreference"}, {"type": "string"}]}
_PARAM_TYPES: dict[str, dict[str, Any]] = {"str": {"type": "string"}, "NetworkModePreference | str": _MODE_REF,
                                           "APNSettings | dict": _APN_REF}


def check_user_tool_schemas(schemas: Any) -> None:
    """Raise ``ValueError`` unless ``schemas`` describe exactly the user tools, in :data:`USER_TOOL_NAMES`'
    order: names, parameters and their types (`jaxagent.envs.tau2.tools.check_schemas`; the two enum and
    object parameters as tau2 generates them), the ``NetworkModePreference`` values, and the
    ``APNSettings`` object equal to :class:`APNSettings`' own JSON schema (fields, types, defaults,
    extra keys forbidden)."""
    check_schemas(schemas, TelecomUserTools, USER_TOOL_NAMES, _PARAM_TYPES)
    order = tuple(s["function"]["name"] for s in schemas)
    if order != USER_TOOL_NAMES:
        raise ValueError(f"user tool schemas: order {order} differs from {USER_TOOL_NAMES}")
    by_name = {s["function"]["name"]: s["function"]["parameters"] for s in schemas}
    mode_defs = by_name["set_network_mode_preference"].get("$defs", {})
    if mode_defs.get("NetworkModePreference", {}).get("enum") != list(NETWORK_MODES):
        raise ValueError(f"user tool schema set_network_mode_preference: $defs {mode_defs} do not list the modes "
                         f"{list(NETWORK_MODES)}")
    own = APNSettings.model_json_schema()
    want = {"APNNames": own["$defs"]["APNNames"], "APNSettings": {k: v for k, v in own.items() if k != "$defs"}}
    got = by_name["set_apn_settings"].get("$defs")
    if got != want:
        raise ValueError(f"user tool schema set_apn_settings: $defs {got} differ from the APNSettings model's {want}")


def user_tool_schemas() -> tuple[dict, ...]:
    """tau2's 30 user-tool OpenAI function schemas, exactly as in :data:`USER_TOOL_SCHEMAS_FILE` (tau2's
    order, descriptions, ``$defs`` and quirks); fresh objects on every call."""
    return tuple(json.loads(schema_file_text(USER_TOOL_SCHEMAS_FILE, check_user_tool_schemas)))


# --------------------------------------------------------------------------------------------------
# the sync between the provider DB and the phone (spec 5)

def _first(records: list[dict], key: str, value: Any, message: str) -> dict:
    for record in records:
        if record[key] == value:
            return record
    raise ToolError(message)


def _customer_by_phone(db: dict, phone_number: str) -> dict:
    """tau2's ``get_customer_by_phone``: per customer in order, the primary number, then its lines'."""
    for customer in db["customers"]:
        if customer["phone_number"] == phone_number:
            return customer
        for line_id in customer["line_ids"]:
            line = _first(db["lines"], "line_id", line_id, f"Line with ID {line_id} not found")
            if line["phone_number"] == phone_number:
                return customer
    raise ToolError(f"Customer with phone number {phone_number} not found")


def sync(db: dict, user_db: dict) -> None:
    """tau2's ``sync_tools``: bring the phone's surroundings in line with the provider DB ``db`` (and a
    paid request back into ``db``). Never searches, so the phone's connection stays as it was.

    Without a phone number, nothing. Else, from the line with that number (first match):
    ``line_active``, ``roaming_allowed`` and ``mobile_data_usage_exceeded``; a paid request sets its
    bill ``Paid`` and is cleared; with no request left, the first ``Awaiting Payment`` bill (in
    ``bill_ids`` order) of the customer owning the number becomes the request. Lookup failures raise
    `ToolError` with tau2's message, after the writes that precede them.
    """
    surroundings = user_db["surroundings"]
    phone_number = surroundings["phone_number"]
    if phone_number is None:
        return
    line = _first(db["lines"], "phone_number", phone_number, f"Line with phone number {phone_number} not found")
    surroundings["line_active"] = line["status"] == "Active"
    surroundings["roaming_allowed"] = bool(line["roaming_enabled"])
    plan = _first(db["plans"], "plan_id", line["plan_id"], f"Plan with ID {line['plan_id']} not found")
    surroundings["mobile_data_usage_exceeded"] = (
        line["data_used_gb"] >= plan["data_limit_gb"] + line["data_refueling_gb"])
    request = surroundings["payment_request"]
    if request is not None and request["paid"]:
        bill_id = request["bill_id"]
        _first(db["bills"], "bill_id", bill_id, f"Bill with ID {bill_id} not found")["status"] = "Paid"
        surroundings["payment_request"] = None
    if surroundings["payment_request"] is None:
        customer = _customer_by_phone(db, phone_number)
        bills = [_first(db["bills"], "bill_id", bill_id, f"Bill with ID {bill_id} not found")
                 for bill_id in customer["bill_ids"]]   # every one looked up, as tau2 does
        awaiting = [bill for bill in bills if bill["status"] == "Awaiting Payment"]
        if awaiting:
            surroundings["payment_request"] = {"bill_id": awaiting[0]["bill_id"],
                                               "amount_due": float(awaiting[0]["total_due"]), "paid": False}
