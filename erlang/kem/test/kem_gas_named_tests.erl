%%% @doc Gas on the named-buffer road from Erlang (issue 27,
%%% docs/metering.md "Named-buffer runs"), on the real port: a runaway
%%% kernel called by kem:run/3 is answered `gas_exhausted' with the gas
%%% used, the port's OS pid stays and the next call is right; the budget is
%%% the call's `gas_limit' option or the node's; dev_kem's `run' key takes
%%% `gas-limit' and answers 402; a run's usage record carries its gas.
-module(kem_gas_named_tests).
-include_lib("eunit/include/eunit.hrl").

-define(NODE_LIMIT, 64 * 5000).

%% Spins until a word no one writes changes; its buffers in groups 1 and 2
%% (the meter takes group 0, the lowest the kernel leaves free).
spin() -> <<"
@group(1) @binding(0) var<storage, read> flag: array<u32>;
@group(2) @binding(3) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  var x = 0u;
  while (flag[0] != 12345u) { x += 1u; }
  out[g.x] = x;
}
">>.

gas_named_test_() ->
    {setup,
     fun() -> kem_test_app:start_with_kernels("kem_gas_named", [{"spin", spin()}, {"counting", kem_test_app:counting_kernel()}],
                                              [{gas_limit, ?NODE_LIMIT}]) end,
     fun kem_test_app:stop_with_kernels/1,
     [{timeout, 60, fun a_runaway_run_ends_by_budget_and_the_port_stays/0},
      {timeout, 60, fun the_calls_gas_limit_bounds_a_correct_run_exactly/0},
      {timeout, 60, fun dev_kem_run_takes_gas_limit_and_answers_402/0},
      {timeout, 60, fun a_runs_usage_record_carries_its_gas/0}]}.

words(List) -> << <<W:32/little>> || W <- List >>.

spin_run(Opts) ->
    kem:run(<<"spin">>, #{<<"flag">> => <<0:32>>}, Opts#{outputs => #{<<"out">> => 256}, workgroups => {1, 1, 1}}).

count_run(Input, Opts) ->
    kem:run(<<"counting">>, #{<<"inp">> => Input}, Opts#{outputs => #{<<"out">> => byte_size(Input)},
                                                         workgroups => {(byte_size(Input) div 4 + 63) div 64, 1, 1}}).

a_runaway_run_ends_by_budget_and_the_port_stays() ->
    [Port] = kem_sup:port_names(),
    OsPid = kem_port:os_pid(Port),
    Input = words(lists:seq(0, 63)),
    Want = #{<<"out">> => words([K * (K - 1) div 2 || K <- lists:seq(0, 63)])},
    ?assertEqual({ok, Want}, count_run(Input, #{})),
    {error, {gas_exhausted, ByNode}} = spin_run(#{}),  % the node's budget: 4999 iterations each
    ?assertNotEqual(nomatch, binary:match(ByNode, <<"of limit ", (integer_to_binary(?NODE_LIMIT))/binary>>)),
    T0 = erlang:monotonic_time(microsecond),
    Result = spin_run(#{gas_limit => 64 * 1000}),
    T1 = erlang:monotonic_time(microsecond),
    ?assertEqual({ok, Want}, count_run(Input, #{})),
    T2 = erlang:monotonic_time(microsecond),
    {error, {gas_exhausted, Detail}} = Result,
    %% 64 invocations, each cap (64000 - 64) div 64 = 999 iterations, ran to 1000
    ?assertMatch({0, _}, binary:match(Detail, <<"gas used 64064 of limit 64000">>)),
    io:format(user, "~nrunaway run answered gas_exhausted in ~.2f ms; the next run in ~.2f ms~n",
              [(T1 - T0) / 1000, (T2 - T1) / 1000]),
    ?assertEqual(OsPid, kem_port:os_pid(Port)).

the_calls_gas_limit_bounds_a_correct_run_exactly() ->
    Input = words(lists:duplicate(64, 10)),  % 64 invocations x 10 iterations: 704 gas
    ?assertMatch({error, {gas_exhausted, _}}, count_run(Input, #{gas_limit => 703})),
    ?assertEqual({ok, #{<<"out">> => words(lists:duplicate(64, 45))}}, count_run(Input, #{gas_limit => 704})),
    [?assertMatch({error, {bad_args, _}}, count_run(Input, #{gas_limit => Bad})) || Bad <- [0, 1 bsl 63, <<"7">>]].

dev_kem_run_takes_gas_limit_and_answers_402() ->
    Req = #{<<"kernel-id">> => <<"counting">>, <<"buffers">> => #{<<"inp">> => words(lists:duplicate(64, 10))},
            <<"outputs">> => #{<<"out">> => 256}, <<"workgroups">> => [1, 1, 1]},
    {error, Short} = dev_kem:run(#{}, Req#{<<"gas-limit">> => <<"703">>}, #{}),
    ?assertMatch(#{<<"status">> := 402, <<"reason">> := <<"gas_exhausted">>}, Short),
    {ok, #{<<"status">> := 200, <<"buffers">> := #{<<"out">> := #{<<"body">> := Out}}}} =
        dev_kem:run(#{}, Req#{<<"gas_limit">> => 704}, #{}),
    ?assertEqual(words(lists:duplicate(64, 45)), Out),
    {error, Bad} = dev_kem:run(#{}, Req#{<<"gas-limit">> => <<"lots">>}, #{}),
    ?assertMatch(#{<<"status">> := 400, <<"reason">> := <<"bad_args">>}, Bad).

%% 64 invocations x 10 iterations: 64 + 640 = 704 gas, counted by hand;
%% kem:run/3's caller sees the outputs alone.
a_runs_usage_record_carries_its_gas() ->
    Buffers = #{<<"inp">> => words(lists:duplicate(64, 10))},
    Opts = #{outputs => #{<<"out">> => 256}, workgroups => {1, 1, 1}},
    Want = #{<<"out">> => words(lists:duplicate(64, 45))},
    {{ok, Want}, Usage} = kem:call_usage(run, {<<"counting">>, Buffers, Opts}, 30000),
    ?assertMatch(#{gas := 704, kernel_id := <<"counting">>}, Usage),
    ?assertEqual({ok, Want}, kem:run(<<"counting">>, Buffers, Opts)),
    {ok, Reply} = dev_kem:run(#{}, #{<<"kernel-id">> => <<"counting">>, <<"buffers">> => Buffers,
                                     <<"outputs">> => #{<<"out">> => 256}, <<"workgroups">> => [1, 1, 1]}, #{}),
    ?assertMatch(#{<<"status">> := 200, <<"kem-usage-gas">> := 704}, Reply).
