%%% @doc `kem:run/3': a kernel called by named buffers, as its author wrote
%%% it (issue 25, docs/kernels.md). `Buffers' maps a WGSL variable name
%%% (binary or atom), `<<"G/B">>' (group/binding) or a binding number of
%%% group 0 to its bytes: every `var<storage, read>' and `var<uniform>' the
%%% kernel declares, and a `var<storage, read_write>' used in place. `Opts':
%%% `outputs => #{Name => Bytes}' (the size of each output not given in
%%% place), `workgroups => {X, Y, Z}' (required: kem's default rules are for
%%% kem@1.0-shaped kernels), `entry_point', `timeout', `gas_limit' (the
%%% call's gas budget, 1..2^63-1, else the node's; docs/metering.md). The
%%% reply is `{ok, #{Name => Bytes}}': every output and in/out buffer by
%%% WGSL name; a looping kernel that passes its budget is
%%% `{error, {gas_exhausted, Detail}}', its port untouched.
%%% The call takes kem:call/3's road: argument checks, quarantine,
%%% placement, timeout, metrics.
-module(kem_run).

-export([run/3]).

-spec run(term(), term(), term()) -> {ok, #{binary() => binary()}} | {error, kem_port:reason()}.
run(KernelId, Buffers, Opts) when is_binary(KernelId), is_map(Buffers), is_map(Opts) ->
    {Timeout, PortOpts} = case maps:take(timeout, Opts) of
        {T, Rest} -> {T, Rest};
        error -> {kem:default_timeout(), Opts}
    end,
    case gas_limit_ok(maps:get(gas_limit, PortOpts, 1)) of
        %% kem:call/3, not call_usage/3: asking the port for the gas it
        %% would drop here made every reply an erlang-py encode of
        %% {Outputs, #{gas => G}} (dev_kem_run asks: its usage is metered).
        true -> kem:call(run, {KernelId, Buffers, PortOpts}, Timeout);
        false -> {error, {bad_args, <<"gas_limit must be an integer 1..2^63-1 (docs/metering.md)">>}}
    end;
run(_KernelId, _Buffers, _Opts) ->
    {error, {bad_args, <<"run(KernelId :: binary(), Buffers :: #{Name => binary()}, Opts :: map())">>}}.

%% As execute's (kem_args): refused before any port, in the same words.
-spec gas_limit_ok(term()) -> boolean().
gas_limit_ok(V) -> is_integer(V) andalso V > 0 andalso V < 1 bsl 63.

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

refused_before_any_port_test() ->
    ?assertMatch({error, {bad_args, _}}, run(<<"k">>, [], #{})),
    ?assertMatch({error, {bad_args, <<"each buffer", _/binary>>}}, run(<<"k">>, #{<<"a">> => 7}, #{})),
    ?assertMatch({error, {bad_args, <<"timeout", _/binary>>}}, run(<<"k">>, #{}, #{timeout => -1})),
    [?assertMatch({error, {bad_args, <<"gas_limit", _/binary>>}}, run(<<"k">>, #{}, #{gas_limit => Bad}))
     || Bad <- [0, -1, 1 bsl 63, <<"100">>]].
-endif.
