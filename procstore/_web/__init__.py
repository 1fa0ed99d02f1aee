"""The web view behind `procstore serve` (private: the command is the interface)."""
