%%% @doc Red team 5 (wave 3, session 5): a binary result is now spliced by
%%% the port (Replies.ok -> FrameWriter.write_result), alone or as an entry
%%% of a `{replies, Index, Blob}' frame when the node sends calls frames.
%%% Many Erlang processes at once call kem:chain/2 and kem:session_call/4
%%% (empty, small and > 64 KiB results, with refusals between them) through
%%% the real port: each caller gets exactly its own bytes, checked against
%%% an Erlang reference on fresh random data.
-module(kem_red_team5_tests).
-include_lib("eunit/include/eunit.hrl").

red_team5_test_() ->
    {setup, fun start/0, fun stop/1,
     [{timeout, 120, fun many_callers_each_get_their_own_binary/0},
      {timeout, 60, fun a_string_key_is_said_to_be_one/0}]}.

start() ->
    Dir = filename:join(kem_test_app:repo_root(), "tests/session_kernels"),
    kem_test_app:start([{kernel_dir, Dir}, {session_quota_bytes, 64 bsl 20}]).

stop(Apps) -> kem_test_app:stop(Apps).

-define(CALLERS, 48).
-define(ROUNDS, 12).

words(Bin) -> [W || <<W:32/little>> <= Bin].
from_words(Ws) -> << <<W:32/little>> || W <- Ws >>.
times(Bin, K) -> from_words([(W * K) band 16#FFFFFFFF || W <- words(Bin)]).
add(A, B) -> from_words([(X + Y) band 16#FFFFFFFF || {X, Y} <- lists:zip(words(A), words(B))]).

many_callers_each_get_their_own_binary() ->
    Parent = self(),
    Pids = [spawn_link(fun() -> Parent ! {done, self(), catch caller(I)} end) || I <- lists:seq(1, ?CALLERS)],
    Results = [receive {done, Pid, R} -> R after 110000 -> timeout end || Pid <- Pids],
    Bad = [R || R <- Results, R =/= ok],
    ?assertEqual([], lists:sublist(Bad, 3)),
    {ok, Stats} = kem:stats(),
    Frames = lists:sum([maps:get(calls_frames, S, 0) || S <- maps:values(Stats)]),
    io:format(user, "~n~p callers x ~p rounds: ~p calls frames~n", [?CALLERS, ?ROUNDS, Frames]),
    ?assert(Frames > 0).  % the node batched: results may have come as replies frames

%% One process's rounds: its own session, chains of its own sizes.
caller(I) ->
    {ok, S} = kem:session_open(#{}),
    Acc0 = crypto:strong_rand_bytes(4 * (16 + I)),
    ok = kem:buffer_create(S, acc, Acc0),
    Acc = lists:foldl(fun(Round, Acc) -> round(I, Round, S, Acc) end, Acc0, lists:seq(1, ?ROUNDS)),
    {ok, Acc} = kem:buffer_read(S, acc),
    ok = kem:session_close(S).

round(I, Round, S, Acc) ->
    Words = case (I + Round) rem 5 of 0 -> 20000; _ -> 1 + (I * 7 + Round) rem 300 end,  % 80 KB: past 64 KiB
    In = crypto:strong_rand_bytes(4 * Words),
    K = 1 + (I + Round) rem 4,
    Steps = lists:duplicate(K, #{kernel => <<"double">>}),
    {ok, Doubled} = kem:chain(Steps, #{input => In}),
    ok = same(Doubled, times(In, 1 bsl K), {chain, I, Round, Words, K}),
    {error, {kernel_not_found, #{step := 2}}} = kem:chain([#{kernel => <<"double">>}, #{kernel => <<"no_such">>}],
                                                         #{input => In}),
    Step = crypto:strong_rand_bytes(byte_size(Acc)),
    Next = add(Acc, Step),
    case Round rem 2 of
        0 -> {ok, <<>>} = kem:session_call(S, <<"accumulate">>, Step, #{output_size => 0});  % an empty result
        1 -> {ok, Got} = kem:session_call(S, <<"accumulate">>, Step, #{}),
             ok = same(Got, Next, {session_call, I, Round})
    end,
    {error, {bad_args, _}} = kem:session_call(S, <<"accumulate">>, Step, #{<<"output_size">> => 0}),
    Next.

same(Got, Want, _What) when Got =:= Want -> ok;
same(Got, Want, What) -> {wrong, What, byte_size(Got), byte_size(Want)}.

%% "kernel" in double quotes is an Erlang string: the port says so, where it
%% answered "unknown step key 'kernel'; known: kernel, ..." (terms.unknown_key).
a_string_key_is_said_to_be_one() ->
    {error, {bad_args, #{step := 1, detail := Detail}}} = kem:chain([#{"kernel" => <<"double">>}], #{input => <<7:32>>}),
    ?assertEqual(<<"step key 'kernel' is a string; keys are atoms: kernel => ...">>, Detail),
    {error, {bad_args, Binary}} = kem:chain([#{kernel => <<"double">>}], #{<<"input">> => <<7:32>>}),
    ?assertEqual(<<"chain option key 'input' is a binary; keys are atoms: input => ...">>, Binary),
    ?assertEqual({ok, <<14:32/little>>}, kem:chain([#{kernel => <<"double">>}], #{input => <<7:32/little>>})).
