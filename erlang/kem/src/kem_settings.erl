%%% @doc One rule from the app env to the port's settings: every key of the
%%% `kem' app env that is not the Erlang side's own becomes the variable
%%% `KEM_' ++ uppercase(key) of each port. The Python side's config
%%% (kem_port/config.py) is the one list of port settings; a new setting
%%% there is reachable from the app env with no change here.
-module(kem_settings).
-export([port_env/0, erlang_only/0]).

%% @doc App env keys read by the Erlang side, never passed to the port.
-spec erlang_only() -> [atom()].
erlang_only() ->
    [python, python_source, venv, ports, timeout, start_timeout, kill_on_timeout, probe_timeout,
     shm_threshold, shm_root, shm_slot_threshold, shm_slots, shm_slot_idle_ms, request_max_output_bytes, quarantine_ms, port_env,
     local_gpus, cluster_nodes, adapters, exclude, weights, spares, warm_kernels, restart_wait].

%% @doc `{Var, Value}' for every port setting in the app env (undefined =
%% not set), then the raw `port_env' pairs, which win.
-spec port_env() -> [{string(), string()}].
port_env() ->
    Mapped = [{var(Key), value(V)} || {Key, V} <- lists:sort(application:get_all_env(kem)),
                                      not lists:member(Key, erlang_only()), V =/= undefined],
    Extra = [{value(K), value(V)} || {K, V} <- application:get_env(kem, port_env, [])],
    Mapped ++ Extra.

var(Key) ->
    "KEM_" ++ string:uppercase(atom_to_list(Key)).

value(V) when is_list(V) ->
    case io_lib:printable_unicode_list(V) of
        true -> V;
        false -> lists:flatten(lists:join(",", [value(E) || E <- V]))
    end;
value(V) when is_binary(V) -> binary_to_list(V);
value(V) when is_integer(V) -> integer_to_list(V);
value(V) when is_atom(V) -> atom_to_list(V).

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

rule_test() ->
    ?assertEqual("KEM_MAX_BATCH", var(max_batch)),
    ?assertEqual("https://a,https://b", value([<<"https://a">>, "https://b"])),
    ?assertEqual("7", value(7)),
    ?assertEqual("strict", value(strict)).
-endif.
