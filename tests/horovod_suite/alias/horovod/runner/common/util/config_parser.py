"""horovod.runner.common.util.config_parser.set_env_from_args: horovodrun's flags that become
variables; mlslrun sets its own from its flags, so nothing is needed here."""


def set_env_from_args(env, args):
    return env
