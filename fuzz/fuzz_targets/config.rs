//! The configuration from TOML text: parsing and validation never panic, and a config that is
//! accepted prints (`config --print`) to TOML that parses back to the same config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slo_probe::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = Config::from_toml(text, "fuzz.toml") {
        let printed = toml::to_string(&config).expect("an accepted config serialises");
        let again = Config::from_toml(&printed, "printed.toml").expect("printed config parses");
        assert_eq!(again, config);
    }
});
