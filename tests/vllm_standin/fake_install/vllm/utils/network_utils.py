"""`get_ip`, which TRL's client reports as the trainer's end of the weight-transfer group: tests stay on loopback."""


def get_ip() -> str:
    return "127.0.0.1"
