"""tau2 telecom's phone (the user DB, its connectivity model, the 30 user tools, the non-tool functions
and the sync with the provider DB) against hand-computed cases of the telecom specification (sections
4, 5 and 6.4): exact texts with their status bars, speeds, hashes and the interplay of settings."""

import json

import pytest

from jaxagent.envs.tau2.db import db_hash
from jaxagent.envs.tau2.domains.telecom import phone
from jaxagent.envs.tau2.domains.telecom.phone import (
    APN_FIELDS,
    DEVICE_FIELDS,
    INITIAL_USER_HASH,
    PYDANTIC_REFERENCE_VERSION,
    SURROUNDINGS_FIELDS,
    USER_ENV_FUNCTIONS,
    USER_READ_TOOLS,
    USER_TOOL_NAMES,
    USER_TOOL_SCHEMAS_FILE,
    USER_WRITE_TOOLS,
    TelecomUserTools,
    can_send_mms,
    default_apn_settings,
    execute_user,
    load_user_db,
    mobile_data_working,
    network_search,
    speed_test,
    status_bar_text,
    sync,
    user_tool_schemas,
)

BAR_GOOD = "Status Bar: 📶³ Good | 5G | 📱 Data Enabled | 🔋 80%"
BAR_EXCELLENT = "Status Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | 🔋 80%"
BAR_AIRPLANE = "Status Bar: ✈️ Airplane Mode | 🔋 80%"
BAR_NO_SERVICE = "Status Bar: 📵 No Signal | 📵 Data Disabled | 🔋 80%"


@pytest.fixture
def user_db():
    return load_user_db()


@pytest.fixture
def tools(user_db):
    return TelecomUserTools(user_db)


def ok(user_db, name, **arguments):
    result = execute_user(user_db, name, arguments)
    assert result.error is False, result.content
    return result.content


def provider_db():
    """A small hand-made provider DB: John (C1) owns L1 (555-0001, active) and L2 (555-0002); Ann (C2),
    listed second, has the primary number 555-0002 too and owns L3 (555-0003)."""
    return {
        "plans": [{"plan_id": "P1", "name": "Basic", "data_limit_gb": 5.0, "price_per_month": 40.0,
                   "data_refueling_price_per_gb": 2.0}],
        "customers": [
            {"customer_id": "C1", "phone_number": "555-0009", "line_ids": ["L1", "L2"], "bill_ids": ["B1", "B2", "B3"]},
            {"customer_id": "C2", "phone_number": "555-0002", "line_ids": ["L3"], "bill_ids": ["B4"]}],
        "lines": [
            {"line_id": "L1", "phone_number": "555-0001", "status": "Active", "plan_id": "P1", "data_used_gb": 1.0,
             "data_refueling_gb": 0.0, "roaming_enabled": False},
            {"line_id": "L2", "phone_number": "555-0002", "status": "Active", "plan_id": "P1", "data_used_gb": 5.0,
             "data_refueling_gb": 0.0, "roaming_enabled": True},
            {"line_id": "L3", "phone_number": "555-0003", "status": "Active", "plan_id": "P1", "data_used_gb": 0.0,
             "data_refueling_gb": 0.0, "roaming_enabled": False}],
        "bills": [{"bill_id": "B1", "total_due": 10.0, "status": "Paid"},
                  {"bill_id": "B2", "total_due": 65, "status": "Issued"},
                  {"bill_id": "B3", "total_due": 30.5, "status": "Awaiting Payment"},
                  {"bill_id": "B4", "total_due": 99.0, "status": "Awaiting Payment"}],
    }


def on_line(user_db, number="555-0001"):
    TelecomUserTools(user_db).set_user_info("John", number)
    return user_db


# --------------------------------------------------------------------------------------------------
# the user DB


def test_initial_user_db_layout_and_hash(user_db):
    assert db_hash(user_db) == INITIAL_USER_HASH == "e1f3a8637388808221228ff3f87294444e6b64caf721f5eb243a85d0a9380b28"
    device, surroundings = user_db["device"], user_db["surroundings"]
    assert list(user_db) == ["device", "surroundings"]
    assert tuple(device) == DEVICE_FIELDS and len(DEVICE_FIELDS) == 22
    assert DEVICE_FIELDS[:3] == ("sim_card_status", "sim_card_missing", "airplane_mode")
    assert DEVICE_FIELDS[-3:] == ("vpn_connected", "vpn_details", "app_statuses")
    assert tuple(device["active_apn_settings"]) == APN_FIELDS == (
        "apn_name", "reset_at_reboot", "mms_apn", "mmsc_url", "mms_proxy", "mms_port")
    assert device["active_apn_settings"] == default_apn_settings() == {
        "apn_name": "internet", "reset_at_reboot": False, "mms_apn": "mms",
        "mmsc_url": "http://mms.carrier.com/mms/wapenc", "mms_proxy": None, "mms_port": None}
    assert type(device["battery_level"]) is int and device["battery_level"] == 80
    assert device["wifi_ssid"] is None and device["vpn_details"] is None
    assert list(device["app_statuses"]) == ["messaging", "browser"]
    assert device["app_statuses"]["messaging"] == {
        "app_name": "messaging", "permissions": {"sms": True, "storage": True, "phone": True, "network": False}}
    assert tuple(surroundings) == SURROUNDINGS_FIELDS
    assert surroundings == {"name": None, "phone_number": None, "is_abroad": False, "roaming_allowed": False,
                            "signal_strength": {"2G": "poor", "3G": "fair", "4G": "good", "5G": "excellent"},
                            "mobile_data_usage_exceeded": False, "line_active": True, "payment_request": None}


def test_load_user_db_gives_independent_copies():
    a, b = load_user_db(), load_user_db()
    a["device"]["app_statuses"]["messaging"]["permissions"]["sms"] = False
    a["surroundings"]["signal_strength"]["5G"] = "none"
    assert b["device"]["app_statuses"]["messaging"]["permissions"]["sms"] is True
    assert load_user_db()["surroundings"]["signal_strength"]["5G"] == "excellent"


def test_load_user_db_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="env.tau2.data_dir"):
        load_user_db(tmp_path)
    (tmp_path / "user_db.toml").write_text('[device]\nbattery_level = "full"\n')
    with pytest.raises(ValueError, match=r"user_db\.toml: device: field 'battery_level' is 'full'; expected an int"):
        load_user_db(tmp_path)
    (tmp_path / "user_db.toml").write_text('[device]\nsim_card_status = "gone"\n')
    with pytest.raises(ValueError, match="field 'sim_card_status' is 'gone'; expected one of 'active'"):
        load_user_db(tmp_path)
    (tmp_path / "user_db.toml").write_text('[device]\ncolour = "red"\n')
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['colour'\]"):
        load_user_db(tmp_path)
    (tmp_path / "user_db.toml").write_text("[device\n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_user_db(tmp_path)
    (tmp_path / "user_db.toml").write_text("[device]\n")   # every field defaulted: tau2's model defaults
    assert db_hash(load_user_db(tmp_path)) == INITIAL_USER_HASH


def test_hash_changes_after_a_write_only(user_db):
    ok(user_db, "check_network_status")
    ok(user_db, "run_speed_test")
    assert db_hash(user_db) == INITIAL_USER_HASH
    ok(user_db, "toggle_data_saver_mode")
    assert db_hash(user_db) != INITIAL_USER_HASH
    ok(user_db, "toggle_data_saver_mode")
    assert db_hash(user_db) == INITIAL_USER_HASH   # no search: back to the loaded state
    ok(user_db, "reboot_device")                    # a search: 5G good -> excellent
    assert db_hash(user_db) != INITIAL_USER_HASH


# --------------------------------------------------------------------------------------------------
# the connectivity model


def test_status_bar_examples(user_db, tools):
    assert status_bar_text(user_db) == "📶³ Good | 5G | 📱 Data Enabled | 🔋 80%"
    tools.turn_airplane_mode_on()
    assert status_bar_text(user_db) == "✈️ Airplane Mode | 🔋 80%"
    tools.connect_vpn()
    assert status_bar_text(user_db) == "✈️ Airplane Mode | 🔒 VPN Connected | 🔋 80%"
    tools.turn_airplane_mode_off()   # turning off keeps the VPN; a search
    assert status_bar_text(user_db) == "📶⁴ Excellent | 5G | 📱 Data Enabled | 🔒 VPN Connected | 🔋 80%"
    tools.disconnect_vpn()
    assert status_bar_text(user_db) == "📶⁴ Excellent | 5G | 📱 Data Enabled | 🔋 80%"
    tools.turn_data_saver_mode_on()
    assert status_bar_text(user_db) == "📶⁴ Excellent | 5G | 📱 Data Enabled | 🔽 Data Saver | 🔋 80%"
    tools.turn_data_off()
    assert status_bar_text(user_db) == "📶⁴ Excellent | 5G | 📵 Data Disabled | 🔋 80%"
    device = user_db["device"]
    device.update(wifi_enabled=True, wifi_connected=True, wifi_ssid="Home", vpn_connected=True, battery_level=7)
    assert status_bar_text(user_db) == ("📶⁴ Excellent | 5G | 📵 Data Disabled | 📡 Connected to Home | "
                                        "🔒 VPN Connected | 🔋 7%")
    device["wifi_ssid"] = None
    assert "| 📡 Enabled |" in status_bar_text(user_db)
    tools.break_apn_settings()
    assert status_bar_text(user_db) == "📵 No Signal | 📵 Data Disabled | 📡 Enabled | 🔒 VPN Connected | 🔋 7%"


@pytest.mark.parametrize(("tech", "signal", "speed", "label"), [
    ("5G", "excellent", 275.0, "Excellent"), ("5G", "good", 220.0, "Excellent"), ("4G", "good", 44.0, "Good"),
    ("3G", "fair", 1.5, "Poor"), ("2G", "poor", 0.05, "Very Poor"), ("none", "none", None, "No Connection")])
def test_speed_examples(user_db, tech, signal, speed, label):
    user_db["device"].update(network_technology_connected=tech, network_signal_strength=signal)
    assert speed_test(user_db) == (speed, label)


def test_speed_with_poor_vpn_and_with_data_saver(user_db, tools):
    assert tools.break_vpn() == "VPN connection broken."   # on the untouched phone: 5G good
    assert speed_test(user_db) == (22.0, "Fair")
    assert tools.run_speed_test() == ("Speed Test Result: 22.00 Mbps (Fair). Connection is okay for web browsing "
                                      "and some standard definition streaming.")
    tools.disconnect_vpn()
    tools.simulate_network_search()
    tools.turn_data_saver_mode_on()
    assert speed_test(user_db) == (55.0, "Good")
    assert tools.run_speed_test() == ("Speed Test Result: 55.00 Mbps (Good). Connection is good for most "
                                      "activities, including HD streaming.")


def test_first_speed_test_of_untouched_phone_vs_after_a_search(user_db):
    assert ok(user_db, "run_speed_test") == "Speed Test Result: 220.00 Mbps (Excellent). Connection is very fast."
    network_search(user_db)
    assert ok(user_db, "run_speed_test") == "Speed Test Result: 275.00 Mbps (Excellent). Connection is very fast."


def test_network_modes_and_their_speeds(user_db):
    expected = {"4g_only": ("4G", "good", "44.00 Mbps (Good)"), "3g_only": ("3G", "fair", "1.50 Mbps (Poor)"),
                "2g_only": ("2G", "poor", "0.05 Mbps (Very Poor)"),
                "4g_5g_preferred": ("5G", "excellent", "275.00 Mbps (Excellent)")}
    for mode, (tech, signal, shown) in expected.items():
        ok(user_db, "set_network_mode_preference", mode=mode)
        device = user_db["device"]
        assert (device["network_technology_connected"], device["network_signal_strength"]) == (tech, signal)
        assert ok(user_db, "run_speed_test").startswith(f"Speed Test Result: {shown}. ")
    assert "Very Poor" in phone._SPEED_ADVICE and ok(user_db, "check_network_mode_preference") == (
        "Network Mode Preference: 4g_5g_preferred")
    user_db["surroundings"]["signal_strength"]["5G"] = "none"   # no 5G here: 4G with the 4G signal
    network_search(user_db)
    assert user_db["device"]["network_technology_connected"] == "4G"
    assert user_db["device"]["network_signal_strength"] == "good"


def test_network_search_outcomes(user_db, tools):
    device = user_db["device"]
    tools.lock_sim_card("pin")
    assert (device["network_connection_status"], device["network_technology_connected"],
            device["network_signal_strength"]) == ("no_service", "none", "none")
    assert tools.check_sim_status() == "The SIM card is locked with a PIN code."
    assert ok(user_db, "reseat_sim_card") == "SIM card re-seated successfully.\n" + BAR_NO_SERVICE   # lock stays
    device["sim_card_status"] = "active"
    user_db["surroundings"]["line_active"] = False
    network_search(user_db)
    assert device["network_connection_status"] == "no_service"
    user_db["surroundings"]["line_active"] = True
    network_search(user_db)
    assert device["network_connection_status"] == "connected"
    # Nothing else (data, roaming, data saver, VPN) affects the search
    user_db["device"].update(data_enabled=False, roaming_enabled=True, data_saver_mode=True, vpn_connected=True)
    network_search(user_db)
    assert (device["network_connection_status"], device["network_technology_connected"]) == ("connected", "5G")


def test_mobile_data_working_conditions(user_db):
    assert mobile_data_working(user_db)
    surroundings, device = user_db["surroundings"], user_db["device"]
    surroundings["is_abroad"] = True
    assert not mobile_data_working(user_db)        # phone roaming off
    device["roaming_enabled"] = True
    assert not mobile_data_working(user_db)        # line roaming not allowed
    surroundings["roaming_allowed"] = True
    assert mobile_data_working(user_db)
    surroundings["mobile_data_usage_exceeded"] = True
    assert not mobile_data_working(user_db)
    assert speed_test(user_db) == (None, "No Connection")
    assert TelecomUserTools(user_db).run_speed_test() == "Speed test failed: No Connection."
    surroundings["mobile_data_usage_exceeded"] = False
    device["network_connection_status"] = "no_service"
    assert not mobile_data_working(user_db)


def test_can_send_mms_conditions(user_db, tools):
    assert can_send_mms(user_db) and tools.can_send_mms() == "Your messaging app can send MMS messages."
    tools.set_network_mode_preference("2g_only")
    assert not can_send_mms(user_db)
    tools.set_network_mode_preference("3g_only")
    assert can_send_mms(user_db)
    assert tools.set_wifi_calling(True) == "Wi-Fi Calling is now ON."
    assert can_send_mms(user_db)                                 # MMS over Wi-Fi still off
    assert tools.set_wifi_calling(True, mms_over_wifi=True) == "Wi-Fi Calling is now ON.\nMMS over Wi-Fi is now ON."
    assert not can_send_mms(user_db)
    tools.toggle_wifi_calling()                                  # MMS-over-Wi-Fi untouched, calling off
    assert user_db["device"]["wifi_calling_mms_over_wifi"] is True and can_send_mms(user_db)
    assert tools.break_apn_mms_setting() == "APN MMS setting broken. Please call reset_apn_settings() to fix."
    assert not can_send_mms(user_db)
    assert tools.check_apn_settings() == ("Current APN Name: internet\nMMSC URL (for picture messages): Not Set\n"
                                          "(These are technical settings, usually best left unchanged.)")
    tools.reset_apn_settings()
    tools.reboot_device()
    assert can_send_mms(user_db)
    assert tools.remove_app_permission("messaging", "STORAGE") == (
        True, "Permission 'storage' removed from app 'messaging'.")
    assert not can_send_mms(user_db)
    assert tools.can_send_mms() == "Your messaging app cannot send MMS messages."
    assert tools.remove_app_permission("camera", "sms") == (False, "App 'camera' not found. Cannot remove permission.")
    assert tools.remove_app_permission("messaging", "camera") == (
        False, "Permission 'camera' not tracked for app 'messaging'.")
    tools.grant_app_permission("messaging", "storage")
    assert can_send_mms(user_db)
    tools.turn_data_off()
    assert not can_send_mms(user_db)
    tools.turn_data_on()
    del user_db["device"]["app_statuses"]["messaging"]
    assert not can_send_mms(user_db)


# --------------------------------------------------------------------------------------------------
# the user tools


def test_read_tool_texts_of_the_untouched_phone(user_db):
    expected = {
        "check_status_bar": BAR_GOOD,
        "check_network_status": ("Airplane Mode: OFF\nSIM Card Status: active\nCellular Connection: connected\n"
                                 "Cellular Signal: good\nCellular Network Type: 5G\nMobile Data Enabled: Yes\n"
                                 "Data Roaming Enabled: No\nWi-Fi Radio: OFF\nWi-Fi Connected: No"),
        "check_network_mode_preference": "Network Mode Preference: 4g_5g_preferred",
        "check_sim_status": "Your SIM card is active and working.",
        "check_data_restriction_status": "Data Saver mode is OFF.",
        "check_apn_settings": ("Current APN Name: internet\nMMSC URL (for picture messages): "
                               "http://mms.carrier.com/mms/wapenc\n(These are technical settings, usually best left "
                               "unchanged.)"),
        "check_wifi_status": "Wi-Fi is turned OFF.",
        "check_wifi_calling_status": "Wi-Fi Calling is currently turned OFF.",
        "check_vpn_status": "VPN is turned OFF.",
        "check_installed_apps": "The following apps are installed on the phone: messaging, browser",
        "can_send_mms": "Your messaging app can send MMS messages.",
        "check_payment_request": "No payment request has been made.",
    }
    for name, text in expected.items():
        assert ok(user_db, name) == text, name
    assert ok(user_db, "check_app_status", app_name="messaging") == (
        "Status for App: messaging\n - Permissions Granted:\n   - sms\n   - storage\n   - phone")
    assert ok(user_db, "check_app_status", app_name="Messaging") == "App 'Messaging' not found on this phone."
    assert ok(user_db, "check_app_permissions", app_name="browser") == (
        "App 'browser' has permission for: storage, network.")
    assert ok(user_db, "check_app_permissions", app_name="camera") == "App 'camera' not found on this phone."
    for permission in ("storage", "network"):
        TelecomUserTools(user_db).remove_app_permission("browser", permission)
    assert ok(user_db, "check_app_status", app_name="browser") == (
        "Status for App: browser\n - Permissions: None granted.")
    assert ok(user_db, "check_app_permissions", app_name="browser") == (
        "App 'browser' currently has no permissions granted.")
    assert db_hash(user_db) != INITIAL_USER_HASH


def test_write_tool_texts_with_status_bar(user_db):
    cases = [
        ("toggle_data", {}, "Mobile Data is now OFF.", "Status Bar: 📶⁴ Excellent | 5G | 📵 Data Disabled | 🔋 80%"),
        ("toggle_data", {}, "Mobile Data is now ON.", BAR_EXCELLENT),
        ("toggle_roaming", {}, "Data Roaming is now ON.", BAR_EXCELLENT),
        ("toggle_roaming", {}, "Data Roaming is now OFF.", BAR_EXCELLENT),
        ("toggle_data_saver_mode", {}, "Data Saver Mode is now ON.",
         "Status Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | 🔽 Data Saver | 🔋 80%"),
        ("toggle_data_saver_mode", {}, "Data Saver Mode is now OFF.", BAR_EXCELLENT),
        ("set_network_mode_preference", {"mode": "4g_only"}, "Preferred Network Mode set to: 4g_only",
         "Status Bar: 📶³ Good | 4G | 📱 Data Enabled | 🔋 80%"),
        ("set_network_mode_preference", {"mode": "4g_5g_preferred"}, "Preferred Network Mode set to: 4g_5g_preferred",
         BAR_EXCELLENT),
        ("reseat_sim_card", {}, "SIM card re-seated successfully.", BAR_EXCELLENT),
        ("set_apn_settings", {"apn_settings": {"apn_name": "internet", "mms_port": 8080}},
         "APN settings set to: internet", BAR_EXCELLENT),
        ("reset_apn_settings", {}, "APN settings will reset at reboot.", BAR_EXCELLENT),
        ("toggle_wifi", {}, "Wi-Fi is now ON.", BAR_EXCELLENT),
        ("toggle_wifi", {}, "Wi-Fi is now OFF.", BAR_EXCELLENT),
        ("toggle_wifi_calling", {}, "Wi-Fi Calling is now ON.", BAR_EXCELLENT),
        ("toggle_wifi_calling", {}, "Wi-Fi Calling is now OFF.", BAR_EXCELLENT),
        ("connect_vpn", {}, "VPN connected successfully.",
         "Status Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | 🔒 VPN Connected | 🔋 80%"),
        ("disconnect_vpn", {}, "VPN disconnected successfully.", BAR_EXCELLENT),
        ("disconnect_vpn", {}, "No active VPN connection to disconnect.", BAR_EXCELLENT),
        ("toggle_airplane_mode", {}, "Airplane Mode is now ON.", BAR_AIRPLANE),
        ("toggle_airplane_mode", {}, "Airplane Mode is now OFF.", BAR_EXCELLENT),
    ]
    ok(user_db, "reboot_device")
    for name, arguments, text, bar in cases:
        assert name in USER_WRITE_TOOLS
        assert ok(user_db, name, **arguments) == f"{text}\n{bar}", (name, arguments)
    assert user_db["device"]["active_apn_settings"]["mms_port"] == 8080
    assert ok(user_db, "connect_vpn").endswith("\n" + "Status Bar: 📶⁴ Excellent | 5G | 📱 Data Enabled | "
                                               "🔒 VPN Connected | 🔋 80%")
    assert ok(user_db, "connect_vpn") == "VPN already connected."   # no bar


def test_set_network_mode_preference_failure(user_db):
    text = ok(user_db, "set_network_mode_preference", mode="5G")
    assert text == ("Failed to set network mode: '5G' is not a valid option. Please use one of: 4g_5g_preferred, "
                    "4g_only, 3g_only, 2g_only\n" + BAR_GOOD)
    assert ok(user_db, "set_network_mode_preference", mode="4G_ONLY").startswith(
        "Failed to set network mode: '4G_ONLY'")
    assert db_hash(user_db) == INITIAL_USER_HASH   # nothing changed, no search


def test_set_network_mode_preference_non_string_is_stored_then_fails(user_db):
    result = execute_user(user_db, "set_network_mode_preference", {"mode": 3})
    assert result == phone.ToolResult("Error: 'int' object has no attribute 'value'", True)
    assert user_db["device"]["network_mode_preference"] == 3                 # tau2 stores it unvalidated
    assert user_db["device"]["network_technology_connected"] == "4G"         # the search's fallback
    assert execute_user(user_db, "check_network_mode_preference", {}).content == (
        "Error: 'int' object has no attribute 'value'")


def test_set_apn_settings_validation(user_db):
    result = execute_user(user_db, "set_apn_settings", {"apn_settings": {"apn_name": "internet", "port": 1}})
    assert result.error
    assert result.content.startswith(
        "Error: 1 validation error for APNSettings\nport\n  Extra inputs are not permitted")
    assert f"https://errors.pydantic.dev/{PYDANTIC_REFERENCE_VERSION}/v/extra_forbidden" in result.content
    result = execute_user(user_db, "set_apn_settings", {"apn_settings": {"apn_name": "Internet"}})
    assert result.content.startswith("Error: 1 validation error for APNSettings\napn_name\n  Input should be "
                                     "'internet' or 'broken'")
    assert db_hash(user_db) == INITIAL_USER_HASH
    assert ok(user_db, "set_apn_settings", apn_settings={"apn_name": "broken"}) == (
        "APN settings set to: broken\n" + BAR_NO_SERVICE)
    assert user_db["device"]["active_apn_settings"] == dict(default_apn_settings(), apn_name="broken")
    # not an object: tau2 stores it, fails, and every later use of the APN settings fails too
    result = execute_user(user_db, "set_apn_settings", {"apn_settings": "internet"})
    assert result == phone.ToolResult("Error: 'str' object has no attribute 'apn_name'", True)
    assert execute_user(user_db, "reboot_device", {}).content == (
        "Error: 'str' object has no attribute 'reset_at_reboot'")
    assert execute_user(user_db, "check_apn_settings", {}).content == (
        "Error: 'str' object has no attribute 'model_copy'")


def test_airplane_mode_wifi_and_vpn_interplay(user_db, tools):
    device = user_db["device"]
    tools.toggle_wifi()
    device.update(wifi_connected=True, wifi_ssid="Home", wifi_signal_strength="good")
    tools.connect_vpn()
    assert ok(user_db, "check_wifi_status") == "Wi-Fi is ON and connected to 'Home'. Signal strength: good."
    assert ok(user_db, "check_network_status").endswith("Wi-Fi Connected: Yes\nConnected Wi-Fi Network: Home")
    assert ok(user_db, "toggle_airplane_mode") == "Airplane Mode is now ON.\n" + BAR_AIRPLANE
    assert (device["wifi_enabled"], device["wifi_connected"], device["wifi_ssid"], device["wifi_signal_strength"]) == (
        True, False, None, "none")                                   # the radio setting is kept
    assert (device["vpn_connected"], device["vpn_details"]) == (False, None)
    assert ok(user_db, "check_wifi_status") == "Wi-Fi is ON but not connected to any network."
    assert ok(user_db, "toggle_wifi") == "Cannot change Wi-Fi settings while Airplane Mode is ON.\n" + BAR_AIRPLANE
    assert device["wifi_enabled"] is True
    assert ok(user_db, "check_network_status").startswith(
        "Airplane Mode: ON\nSIM Card Status: active\nCellular Connection: no_service\nCellular Signal: none\n"
        "Cellular Network Type: none\n")
    device.update(wifi_connected=True, wifi_ssid="Cafe")             # off again: a connected Wi-Fi is dropped
    assert ok(user_db, "toggle_airplane_mode") == "Airplane Mode is now OFF.\n" + BAR_EXCELLENT
    assert (device["wifi_connected"], device["wifi_ssid"], device["network_connection_status"]) == (
        False, None, "connected")
    device.update(wifi_connected=True, wifi_ssid="Cafe", wifi_signal_strength="fair")
    assert ok(user_db, "toggle_wifi") == "Wi-Fi is now OFF.\n" + BAR_EXCELLENT
    assert (device["wifi_connected"], device["wifi_ssid"], device["wifi_signal_strength"]) == (False, None, "none")


def test_turn_airplane_mode_on_when_on_toggles_twice(user_db, tools):
    assert tools.turn_airplane_mode_on() == "Airplane Mode is now ON."
    tools.connect_vpn()                      # allowed in airplane mode
    assert tools.turn_airplane_mode_on() == "Airplane Mode is now ON."
    assert user_db["device"]["airplane_mode"] is True and user_db["device"]["vpn_connected"] is False
    assert tools.turn_airplane_mode_off() == "Airplane Mode is now OFF."
    assert tools.turn_airplane_mode_off() == "Airplane Mode is now OFF."
    assert user_db["device"]["airplane_mode"] is False
    assert tools.assert_airplane_mode_status(False) and not tools.assert_airplane_mode_status(True)


def test_reboot_with_and_without_reset_at_reboot(user_db, tools):
    tools.break_apn_settings()
    assert ok(user_db, "reboot_device") == "Restarting network services...\n" + BAR_NO_SERVICE   # still broken
    assert ok(user_db, "reset_apn_settings") == "APN settings will reset at reboot.\n" + BAR_NO_SERVICE
    assert user_db["device"]["active_apn_settings"]["apn_name"] == "broken"
    assert ok(user_db, "reboot_device") == "Resetting APN settings...\nRestarting network services...\n" + BAR_EXCELLENT
    assert user_db["device"]["active_apn_settings"] == default_apn_settings()
    assert tools.assert_service_status("connected")


def test_grant_app_permission_texts(user_db):
    assert ok(user_db, "grant_app_permission", app_name="browser", permission="SMS") == (
        "Success. Permission 'sms' granted to app 'browser'.\n" + BAR_GOOD)
    assert user_db["device"]["app_statuses"]["browser"]["permissions"]["sms"] is True
    assert ok(user_db, "grant_app_permission", app_name="camera", permission="sms") == (
        "Error. App 'camera' not found. Cannot grant permission.\n" + BAR_GOOD)
    assert ok(user_db, "grant_app_permission", app_name="messaging", permission="Location") == (
        "Error. Permission 'location' not tracked for app 'messaging', available permissions: ['sms', 'storage', "
        "'phone', 'network']\n" + BAR_GOOD)


def test_check_vpn_status_repr(user_db, tools):
    tools.connect_vpn()
    assert ok(user_db, "check_vpn_status") == (
        "VPN is ON and connected. Details: {'server_address': '192.168.1.1', 'protocol': 'OpenVPN', "
        "'server_performance': <PerformanceLevel.EXCELLENT: 'excellent'>}")
    tools.break_vpn()   # already connected: only the performance changes
    assert ok(user_db, "check_vpn_status").endswith("'server_performance': <PerformanceLevel.POOR: 'poor'>}")
    user_db["device"]["vpn_details"] = None
    assert ok(user_db, "check_vpn_status") == "VPN is ON and connected (no specific details available)."
    user_db["device"].update(vpn_connected=False, vpn_enabled_setting=True)
    assert ok(user_db, "check_vpn_status") == "VPN is turned ON in settings, but currently not connected."


def test_break_vpn_does_not_leak_into_other_phones():
    first, second = load_user_db(), load_user_db()
    TelecomUserTools(first).break_vpn()
    assert first["device"]["vpn_details"]["server_performance"] == "poor"
    ok(second, "connect_vpn")
    assert second["device"]["vpn_details"] == {"server_address": "192.168.1.1", "protocol": "OpenVPN",
                                               "server_performance": "excellent"}
    assert speed_test(second) == (220.0, "Excellent")
    TelecomUserTools(second).disconnect_vpn()
    ok(second, "connect_vpn")
    assert second["device"]["vpn_details"]["server_performance"] == "excellent"


def test_non_tool_functions(user_db, tools):
    assert tools.set_user_info("John Smith", "555-123-2002") is None
    assert user_db["surroundings"]["name"] == "John Smith"
    assert tools.set_user_location(True) is None and user_db["surroundings"]["is_abroad"] is True
    assert tools.unseat_sim_card() == "SIM card un-seated successfully."
    assert tools.check_sim_status() == "No SIM card detected in the phone."
    assert tools.assert_service_status("no_service")
    tools.reseat_sim_card()
    assert tools.lock_sim_card("puk") == "SIM card locked successfully in puk mode."
    assert tools.check_sim_status() == "The SIM card is locked with a PUK code."
    user_db["device"]["sim_card_status"] = "active"
    assert tools.turn_data_off() == "Data connection broken." and user_db["device"]["data_enabled"] is False
    assert tools.turn_data_off() == "Data connection broken." and user_db["device"]["data_enabled"] is False
    assert user_db["device"]["network_connection_status"] == "connected"   # turn_data_off searched
    user_db["device"]["network_connection_status"] = "searching"
    assert tools.turn_data_on() == "Data connection restored."
    assert user_db["device"]["network_connection_status"] == "searching"   # turn_data_on does not
    assert tools.turn_roaming_on() == "Data Roaming is now ON." and tools.assert_mobile_roaming_status(True)
    assert tools.turn_roaming_on() == "Data Roaming is now ON." and tools.assert_mobile_roaming_status(True)
    assert tools.turn_roaming_off() == "Data Roaming is now OFF." and tools.assert_mobile_roaming_status(False)
    assert tools.turn_data_saver_mode_on() == "Data Saver Mode is now ON."
    assert tools.assert_mobile_data_saver_mode_status(True)
    assert tools.turn_data_saver_mode_off() == "Data Saver Mode is now OFF."
    assert tools.set_wifi_calling(False) == "Wi-Fi Calling is now OFF."
    assert tools.break_apn_settings() == "APN settings broken. Please call reset_apn_settings() to fix."
    assert tools.assert_service_status("no_service") and not tools.assert_service_status("connected")
    with pytest.raises(ValueError, match="'online' is not a valid NetworkStatus"):
        tools.assert_service_status("online")
    assert tools.simulate_network_search() is None


def test_assertions(user_db, tools):
    assert tools.assert_mobile_data_status(True)
    assert tools.assert_internet_speed(200, "excellent") and tools.assert_internet_speed(220.0)
    assert not tools.assert_internet_speed(221) and not tools.assert_internet_speed(10, "good")
    assert not tools.assert_internet_not_excellent()
    tools.break_vpn()
    assert tools.assert_internet_not_excellent() and not tools.assert_internet_speed(200, "excellent")
    assert tools.assert_can_send_mms(True)
    tools.turn_airplane_mode_on()
    assert tools.assert_mobile_data_status(False) and tools.assert_can_send_mms(False)
    assert tools.assert_internet_speed(0.0) and not tools.assert_internet_speed(0.1)
    assert tools.assert_internet_not_excellent()   # "No Connection"
    assert tools.assert_mobile_data_usage_exceeded(False)
    user_db["surroundings"]["mobile_data_usage_exceeded"] = True
    assert tools.assert_mobile_data_usage_exceeded(True)


# --------------------------------------------------------------------------------------------------
# calling, names and schemas


def test_tool_name_sets():
    assert len(USER_TOOL_NAMES) == 30 == len(set(USER_TOOL_NAMES))
    assert USER_READ_TOOLS | USER_WRITE_TOOLS == set(USER_TOOL_NAMES) and not USER_READ_TOOLS & USER_WRITE_TOOLS
    assert len(USER_READ_TOOLS) == 15 == len(USER_WRITE_TOOLS) and {"run_speed_test", "can_send_mms"} <= USER_READ_TOOLS
    assert {"make_payment", "reboot_device", "reset_apn_settings"} <= USER_WRITE_TOOLS
    assert not USER_ENV_FUNCTIONS & set(USER_TOOL_NAMES)
    for name in USER_TOOL_NAMES + tuple(USER_ENV_FUNCTIONS):
        assert callable(getattr(TelecomUserTools, name)), name


def test_unknown_and_environment_function_names_are_not_found(user_db):
    for name in ("get_customer_by_id", "break_vpn", "assert_service_status", "simulate_network_search", "nope"):
        assert execute_user(user_db, name, {}) == phone.ToolResult(f"Error: Tool '{name}' not found.", True)
    assert db_hash(user_db) == INITIAL_USER_HASH


def test_argument_errors_name_the_class(user_db):
    assert execute_user(user_db, "toggle_data", {"extra": 1}).content == (
        "Error: TelecomUserTools.toggle_data() got an unexpected keyword argument 'extra'")
    assert execute_user(user_db, "check_app_status", {}).content == (
        "Error: TelecomUserTools.check_app_status() missing 1 required positional argument: 'app_name'")
    assert execute_user(user_db, "grant_app_permission", {"app_name": "messaging", "permission": 5}).content == (
        "Error: 'int' object has no attribute 'lower'")


def test_user_tool_schemas_are_the_file(user_db):
    with open(USER_TOOL_SCHEMAS_FILE, encoding="utf-8") as fh:
        tools = json.load(fh)["tools"]
    schemas = user_tool_schemas()
    assert list(schemas) == tools
    assert tuple(s["function"]["name"] for s in schemas) == USER_TOOL_NAMES
    schemas[0]["function"]["name"] = "changed"
    assert user_tool_schemas()[0]["function"]["name"] == "check_status_bar"


def test_user_tool_schema_check_catches_drift():
    tools = list(user_tool_schemas())
    phone.check_user_tool_schemas(tools)
    with pytest.raises(ValueError, match="order"):
        phone.check_user_tool_schemas([tools[1], tools[0], *tools[2:]])
    apn = json.loads(json.dumps(tools))
    apn[13]["function"]["parameters"]["$defs"]["APNSettings"]["properties"]["mms_port"]["default"] = 80
    with pytest.raises(ValueError, match="set_apn_settings"):
        phone.check_user_tool_schemas(apn)
    modes = json.loads(json.dumps(tools))
    modes[3]["function"]["parameters"]["$defs"]["NetworkModePreference"]["enum"].append("5g_only")
    with pytest.raises(ValueError, match="set_network_mode_preference"):
        phone.check_user_tool_schemas(modes)


# --------------------------------------------------------------------------------------------------
# the sync


def test_sync_without_phone_number_does_nothing(user_db):
    db = provider_db()
    sync(db, user_db)
    assert db_hash(user_db) == INITIAL_USER_HASH and db == provider_db()


def test_sync_line_flags_and_unknown_number(user_db):
    db = provider_db()
    on_line(user_db, "555-0001")
    sync(db, user_db)
    s = user_db["surroundings"]
    assert (s["line_active"], s["roaming_allowed"], s["mobile_data_usage_exceeded"]) == (True, False, False)
    assert s["payment_request"] == {"bill_id": "B3", "amount_due": 30.5, "paid": False}   # C1's first awaiting
    db["lines"][0].update(status="Suspended", roaming_enabled=True, data_used_gb=5.0)
    sync(db, user_db)
    assert (s["line_active"], s["roaming_allowed"], s["mobile_data_usage_exceeded"]) == (False, True, True)
    db["lines"][0]["data_refueling_gb"] = 0.5                         # 5.0 < 5.0 + 0.5
    sync(db, user_db)
    assert s["mobile_data_usage_exceeded"] is False
    on_line(user_db, "5550001")
    with pytest.raises(phone.ToolError, match="^Line with phone number 5550001 not found$"):
        sync(db, user_db)


def test_make_payment_and_sync_mark_the_bill_paid(user_db):
    db = provider_db()
    assert ok(user_db, "make_payment") == "You do not have a payment request."
    db["bills"][2]["status"] = "Issued"
    on_line(user_db, "555-0001")
    sync(db, user_db)
    assert user_db["surroundings"]["payment_request"] is None
    db["bills"][1]["status"] = "Awaiting Payment"                     # the agent's send_payment_request for B2
    sync(db, user_db)
    assert user_db["surroundings"]["payment_request"] == {"bill_id": "B2", "amount_due": 65.0, "paid": False}
    assert type(user_db["surroundings"]["payment_request"]["amount_due"]) is float   # pydantic's float field
    assert ok(user_db, "check_payment_request") == "You have a payment request for bill B2 of 65.0 USD."
    assert ok(user_db, "make_payment") == "Payment of 65.0 USD has been made for bill B2."
    assert user_db["surroundings"]["payment_request"]["paid"] is True and db["bills"][1]["status"] == "Awaiting Payment"
    sync(db, user_db)
    assert db["bills"][1]["status"] == "Paid" and user_db["surroundings"]["payment_request"] is None
    assert ok(user_db, "check_payment_request") == "No payment request has been made."


def test_unpaid_request_stays_until_paid(user_db):
    db = provider_db()
    on_line(user_db, "555-0001")
    sync(db, user_db)
    db["bills"][1]["status"] = "Awaiting Payment"   # another awaiting bill does not replace the current request
    sync(db, user_db)
    assert user_db["surroundings"]["payment_request"]["bill_id"] == "B3"


def test_another_customers_bill_never_reaches_this_phone(user_db):
    db = provider_db()
    db["bills"][2]["status"] = "Issued"             # only Ann's (C2) B4 awaits payment
    db["customers"][1]["phone_number"] = "555-0100"
    on_line(user_db, "555-0001")
    sync(db, user_db)
    assert user_db["surroundings"]["payment_request"] is None
    # the owner is found as get_customer_by_phone: C1 (listed first) owns 555-0002 through its line L2,
    # although Ann's primary number is 555-0002 too
    db["customers"][1]["phone_number"] = "555-0002"
    on_line(user_db, "555-0002")
    sync(db, user_db)
    assert user_db["surroundings"]["payment_request"] is None
    assert user_db["surroundings"]["roaming_allowed"] is True and user_db["surroundings"]["mobile_data_usage_exceeded"]
    on_line(user_db, "555-0003")
    sync(db, user_db)
    assert user_db["surroundings"]["payment_request"] == {"bill_id": "B4", "amount_due": 99.0, "paid": False}


def test_sync_missing_records():
    user_db = on_line(load_user_db(), "555-0001")
    db = provider_db()
    db["customers"][0]["bill_ids"].append("B9")
    with pytest.raises(phone.ToolError, match="^Bill with ID B9 not found$"):
        sync(db, user_db)
    db = provider_db()
    db["lines"][0]["plan_id"] = "P9"
    with pytest.raises(phone.ToolError, match="^Plan with ID P9 not found$"):
        sync(db, user_db)
    db = provider_db()
    db["customers"] = [db["customers"][1]]
    with pytest.raises(phone.ToolError, match="^Customer with phone number 555-0001 not found$"):
        sync(db, user_db)


def test_phone_lags_a_suspension_until_a_search(user_db):
    db = provider_db()
    tools = TelecomUserTools(on_line(user_db, "555-0001"))
    sync(db, user_db)
    db["lines"][0]["status"] = "Suspended"          # the agent's suspend_line
    sync(db, user_db)
    assert user_db["surroundings"]["line_active"] is False
    assert user_db["device"]["network_connection_status"] == "connected"     # stale
    assert tools.assert_mobile_data_status(True) and ok(user_db, "check_status_bar") == BAR_GOOD
    assert ok(user_db, "reboot_device") == "Restarting network services...\n" + BAR_NO_SERVICE
    assert tools.assert_service_status("no_service") and tools.assert_mobile_data_status(False)
    db["lines"][0]["status"] = "Active"             # resume_line: still no service until the next search
    sync(db, user_db)
    assert tools.assert_service_status("no_service")
    ok(user_db, "toggle_airplane_mode")
    ok(user_db, "toggle_airplane_mode")
    assert tools.assert_service_status("connected") and tools.assert_internet_speed(200, "excellent")


def test_sync_with_the_packaged_provider_db(user_db):
    telecom_db = pytest.importorskip("jaxagent.envs.tau2.domains.telecom.db")
    db = telecom_db.load_db()
    tools = TelecomUserTools(user_db)
    tools.set_user_info("John Smith", "555-123-2002")
    sync(db, user_db)
    s = user_db["surroundings"]
    assert (s["line_active"], s["roaming_allowed"], s["mobile_data_usage_exceeded"], s["payment_request"]) == (
        True, True, False, None)                   # L1002: active, roaming, 8.7 of 15 GB; no bill awaiting
    bill = next(b for b in db["bills"] if b["bill_id"] == "B1002")
    bill["status"] = "Awaiting Payment"
    sync(db, user_db)
    assert s["payment_request"] == {"bill_id": "B1002", "amount_due": float(bill["total_due"]), "paid": False}
    ok(user_db, "make_payment")
    sync(db, user_db)
    assert bill["status"] == "Paid" and s["payment_request"] is None
