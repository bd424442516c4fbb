%%% @doc What a port owner's held calls go out as (docs/protocol.md, "Group
%%% frames" and "Batch frames"): the pure part of kem_port's flush.
%%%
%%% While callers queue, kem_port holds their calls. A plain kernel call
%%% (`execute_kernel', `{KernelId, Input, Hint}', a small input) is held raw,
%%% not encoded: at flush the calls that share `{KernelId, Hint,
%%% byte_size(Input)}' become one `{group, KernelId, Hint, Entries, Inputs}'
%%% frame (the port checks, prepares and answers them once, not once per
%%% call); everything else goes as before: one `{calls, [Frame]}' frame, or
%%% a lone frame for a lone call.
%%%
%%% Frames are iolists with hand-written ETF heads; a group's inputs are
%%% the callers' own binaries (no copy, no `term_to_binary' of them).
-module(kem_group).

-export([held/4, held_bytes/1, frames/1, request/4]).

%% Group frames: at most 256 calls (the port's cap) and about 1 MiB of
%% inputs (half the port's 2 MiB frame limit, like a calls frame). The
%% owner holds at most 64 calls (kem_port ?HOLD_CALLS, measured there), so
%% in practice a group's calls cap is 64.
-define(GROUP_CALLS, 256).
-define(GROUP_BYTES, 1048576).
%% A candidate's input: at most 64 KiB (a larger call is bulk, on its own
%% road); a kernel id of 1-128 bytes (the port's rule: longer is refused
%% anyway); a hint that is a 32-bit ETF integer (a larger one can only be
%% refused: its output would pass every size limit).
-define(GROUP_INPUT_BYTES, 65536).
-define(IS_CANDIDATE(K, I, H),
        (is_binary(K) andalso byte_size(K) >= 1 andalso byte_size(K) =< 128 andalso
         is_binary(I) andalso byte_size(I) >= 1 andalso byte_size(I) =< ?GROUP_INPUT_BYTES andalso
         is_integer(H) andalso H >= 1 andalso H =< 16#7FFFFFFF)).
%% Calls frames, as before (docs/protocol.md, "Batch frames"): at most 64
%% calls (the GPU loop's largest batch); a call frame over 64 KiB goes alone.
-define(CALLS_PER_FRAME, 64).
-include("kem_frames.hrl").
%% ETF heads, written here byte for byte (kem_port/batch_frames.py and the
%% port's group reader match them).
-define(VERSION, 131).
-define(CALLS_HEAD, ?VERSION, 104, 2, 119, 5, "calls", 108).
-define(GROUP_HEAD, ?VERSION, 104, 5, 119, 5, "group").
-define(SMALL_INTEGER_EXT, 97).
-define(INTEGER_EXT, 98).
-define(BINARY_EXT, 109).
-define(NIL_EXT, 106).

%% A held call: its encoded frame, or a group candidate's parts.
-type item() :: binary() | {kernel, binary(), binary(), pos_integer(), timeout()}.
-type held() :: {ReqId :: non_neg_integer(), item()}.
-type unit() :: {group | calls | lone, [held()], iodata()}.
-export_type([held/0, unit/0]).

%% @doc The held form of call Id: a group candidate's raw parts, or the
%% call's own frame.
-spec held(non_neg_integer(), atom(), tuple(), timeout()) -> held().
held(Id, execute_kernel, {KernelId, Input, Hint}, Timeout) when ?IS_CANDIDATE(KernelId, Input, Hint) ->
    {Id, {kernel, KernelId, Input, Hint, Timeout}};
held(Id, Method, Args, Timeout) ->
    {Id, term_to_binary(request(Id, Method, Args, Timeout))}.

%% @doc About what a held call adds to the frames it goes out in.
-spec held_bytes(item()) -> non_neg_integer().
held_bytes({kernel, KernelId, Input, _Hint, _Timeout}) -> byte_size(KernelId) + byte_size(Input) + 32;
held_bytes(Frame) -> byte_size(Frame).

%% @doc One request term. The call's timeout travels with it: the port
%% answers `timeout' itself when it passes while the call is queued or
%% fetching (docs/protocol.md).
-spec request(non_neg_integer(), atom(), tuple(), timeout()) -> tuple().
request(Id, Method, Args, infinity) -> {call, Id, Method, Args};
request(Id, Method, Args, Timeout) -> {call, Id, Method, Args, max(1, Timeout)}.

%% @doc The frames for held calls (oldest first): a group frame for each
%% `{KernelId, Hint, InputSize}' shared by two calls or more (split at
%% ?GROUP_CALLS calls or ?GROUP_BYTES of inputs), then the rest as calls
%% frames of at most ?CALLS_PER_FRAME, a call alone where it is alone or
%% its frame is over ?LONE_BYTES. Each frame comes with the calls it holds.
-spec frames([held()]) -> [unit()].
frames([One]) ->
    [{lone, [One], frame_of(One)}];
frames(Held) ->
    {Keys, ByKey, Plain} = partition(Held, [], #{}, []),
    {Groups, Alone} = lists:foldl(fun(Key, {GAcc, AAcc}) ->
                                      {G, A} = group_units(Key, lists:reverse(maps:get(Key, ByKey))),
                                      {[G | GAcc], A ++ AAcc}
                                  end, {[], []}, lists:reverse(Keys)),
    lists:append(lists:reverse(Groups)) ++ plain_units(lists:reverse(Plain, lists:reverse(Alone))).

%% Candidates by key (keys in order of first sight, newest first), the
%% others as they came (newest first).
partition([H = {_Id, {kernel, KernelId, Input, Hint, _T}} | Rest], Keys, ByKey, Plain) ->
    Key = {KernelId, Hint, byte_size(Input)},
    case ByKey of
        #{Key := Calls} -> partition(Rest, Keys, ByKey#{Key := [H | Calls]}, Plain);
        _ -> partition(Rest, [Key | Keys], ByKey#{Key => [H]}, Plain)
    end;
partition([H | Rest], Keys, ByKey, Plain) ->
    partition(Rest, Keys, ByKey, [H | Plain]);
partition([], Keys, ByKey, Plain) ->
    {Keys, ByKey, Plain}.

%% One key's calls: group frames, and a call left alone (a key seen once,
%% or one left over by a split).
group_units({KernelId, Hint, Size}, Calls) ->
    PerFrame = max(2, min(?GROUP_CALLS, ?GROUP_BYTES div Size)),
    Chunks = chunks(Calls, PerFrame),
    {[{group, C, group_frame(KernelId, Hint, C)} || C <- Chunks, length(C) >= 2],
     [One || [One] <- Chunks]}.

chunks([], _N) -> [];
chunks(List, N) when length(List) =< N -> [List];
chunks(List, N) ->
    {Chunk, Rest} = lists:split(N, List),
    [Chunk | chunks(Rest, N)].

%% The calls no group takes, as today: lone frames and calls frames.
plain_units(Held) ->
    Framed = [{H, frame_of(H)} || H <- Held],
    {Big, Small} = lists:partition(fun({_H, F}) -> byte_size(F) > ?LONE_BYTES end, Framed),
    [{lone, [H], F} || {H, F} <- Big] ++ [calls_unit(C) || C <- chunks(Small, ?CALLS_PER_FRAME)].

calls_unit([{One, Frame}]) ->
    {lone, [One], Frame};
calls_unit(Framed) ->
    Items = [[<<?BINARY_EXT, (byte_size(F)):32>>, F] || {_H, F} <- Framed],
    {calls, [H || {H, _F} <- Framed], [<<?CALLS_HEAD, (length(Framed)):32>>, Items, <<?NIL_EXT>>]}.

frame_of({Id, {kernel, KernelId, Input, Hint, Timeout}}) ->
    term_to_binary(request(Id, execute_kernel, {KernelId, Input, Hint}, Timeout));
frame_of({_Id, Frame}) ->
    Frame.

%% `{group, KernelId, Hint, Entries, Inputs}': Entries a 12-byte
%% `<<ReqId:64, TimeoutMs:32>>' per call (0: no timeout), Inputs the
%% callers' binaries back to back, as an iolist.
group_frame(KernelId, Hint, Calls = [{_, {kernel, _, First, _, _}} | _]) ->
    Entries = << <<Id:64, (wire_timeout(T)):32>> || {Id, {kernel, _, _, _, T}} <- Calls >>,
    Inputs = [I || {_, {kernel, _, I, _, _}} <- Calls],
    [<<?GROUP_HEAD, ?BINARY_EXT, (byte_size(KernelId)):32>>, KernelId, hint(Hint),
     <<?BINARY_EXT, (byte_size(Entries)):32>>, Entries,
     <<?BINARY_EXT, (length(Calls) * byte_size(First)):32>>, Inputs].

wire_timeout(infinity) -> 0;
wire_timeout(T) -> max(1, T).

hint(H) when H =< 255 -> <<?SMALL_INTEGER_EXT, H>>;
hint(H) -> <<?INTEGER_EXT, H:32/signed>>.

%%% Tests

-ifdef(TEST).
-include_lib("eunit/include/eunit.hrl").

cand(Id, K, I, H, T) -> held(Id, execute_kernel, {K, I, H}, T).

decode(Unit) -> binary_to_term(iolist_to_binary(element(3, Unit))).

ids(Unit) -> [Id || {Id, _} <- element(2, Unit)].

%% The node's bytes decode to exactly the spec's term, for every hint
%% encoding and timeout form.
group_frame_bytes_test() ->
    [begin
         Inputs = [crypto:strong_rand_bytes(Size) || _ <- lists:seq(1, N)],
         Timeouts = [lists:nth(1 + I rem 3, [infinity, 1, 16#FFFFFFFF - 2001]) || I <- lists:seq(1, N)],
         Held = [cand(Id, K, In, H, T) || {Id, In, T} <- lists:zip3(lists:seq(7, 6 + N), Inputs, Timeouts)],
         [Unit] = frames(Held),
         Entries = << <<Id:64, (wire_timeout(T)):32>> || {Id, T} <- lists:zip(lists:seq(7, 6 + N), Timeouts) >>,
         ?assertEqual(group, element(1, Unit)),
         ?assertEqual({group, K, H, Entries, iolist_to_binary(Inputs)}, decode(Unit)),
         ?assertEqual(lists:seq(7, 6 + N), ids(Unit))
     end
     || K <- [<<"d">>, <<"double">>, binary:copy(<<"k">>, 128)],
        H <- [1, 255, 256, 16#7FFFFFFF],
        {N, Size} <- [{2, 1}, {3, 4}, {64, 12}, {256, 4}]],
    ok.

%% Timeouts as the 5-tuple carries them; `infinity' is 0.
wire_timeouts_test() ->
    [Unit] = frames([cand(1, <<"k">>, <<1>>, 1, infinity), cand(2, <<"k">>, <<2>>, 1, 5000)]),
    {group, _, _, <<1:64, 0:32, 2:64, 5000:32>>, <<1, 2>>} = decode(Unit).

%% What is not a candidate keeps its encoded frame.
candidates_test() ->
    Plain = [{execute_kernel, {<<"k">>, <<>>, 1}}, {execute_kernel, {<<"k">>, <<1>>, 0}},
             {execute_kernel, {<<"k">>, <<1>>, 1 bsl 31}}, {execute_kernel, {<<"k">>, <<1>>, 1.0}},
             {execute_kernel, {<<>>, <<1>>, 1}}, {execute_kernel, {binary:copy(<<"k">>, 129), <<1>>, 1}},
             {execute_kernel, {<<"k">>, binary:copy(<<1>>, 65537), 1}},
             {execute_kernel, {"k", <<1>>, 1}}, {execute_kernel, {<<"k">>, [1], 1}},
             {execute_kernel, {<<"k">>, <<1>>, 1, #{}}}, {execute_kernel_with_params, {<<"k">>, <<1>>, <<>>, 1}},
             {execute, {<<"k">>, <<1>>, 1}}],
    [?assertEqual({3, term_to_binary(request(3, M, A, 100))}, held(3, M, A, 100)) || {M, A} <- Plain],
    ?assertMatch({3, {kernel, _, _, _, _}}, held(3, execute_kernel, {<<"k">>, binary:copy(<<1>>, 65536), 1}, 1)).

%% A lone call is one ordinary frame, candidate or not.
lone_test() ->
    [U1] = frames([cand(5, <<"k">>, <<1, 2, 3, 4>>, 2, 100)]),
    ?assertEqual({lone, {call, 5, execute_kernel, {<<"k">>, <<1, 2, 3, 4>>, 2}, 100}}, {element(1, U1), decode(U1)}),
    [U2] = frames([held(6, ping, {}, infinity)]),
    ?assertEqual({lone, {call, 6, ping, {}}}, {element(1, U2), decode(U2)}).

%% Groups by key; singletons and the others share one calls frame; each
%% call is in exactly one frame.
partition_test() ->
    Held = [cand(1, <<"a">>, <<1, 1, 1, 1>>, 1, 100),
            held(2, execute_kernel_with_params, {<<"a">>, <<1>>, <<2>>, 1}, 100),
            cand(3, <<"a">>, <<2, 2, 2, 2>>, 1, infinity),
            cand(4, <<"a">>, <<3, 3>>, 1, 100),            % another size
            cand(5, <<"a">>, <<4, 4, 4, 4>>, 2, 100),      % another hint
            cand(6, <<"b">>, <<5, 5, 5, 5>>, 1, 100),      % another kernel
            cand(7, <<"b">>, <<6, 6, 6, 6>>, 1, 100),
            cand(8, <<"a">>, <<7, 7, 7, 7>>, 1, 100),
            held(9, stats, {}, 100)],
    [G1, G2, C] = frames(Held),
    ?assertEqual({group, [1, 3, 8]}, {element(1, G1), ids(G1)}),
    ?assertEqual({group, <<"a">>, 1, <<1:64, 100:32, 3:64, 0:32, 8:64, 100:32>>, <<1, 1, 1, 1, 2, 2, 2, 2, 7, 7, 7, 7>>},
                 decode(G1)),
    ?assertEqual({group, [6, 7]}, {element(1, G2), ids(G2)}),
    ?assertEqual({calls, [2, 9, 4, 5]}, {element(1, C), ids(C)}),
    {calls, Frames} = decode(C),
    ?assertEqual([{call, 2, execute_kernel_with_params, {<<"a">>, <<1>>, <<2>>, 1}, 100},
                  {call, 9, stats, {}, 100},
                  {call, 4, execute_kernel, {<<"a">>, <<3, 3>>, 1}, 100},
                  {call, 5, execute_kernel, {<<"a">>, <<4, 4, 4, 4>>, 2}, 100}],
                 [binary_to_term(F) || F <- Frames]).

%% Split at 256 calls; a call left over by a split goes alone.
split_by_calls_test() ->
    Held = [cand(Id, <<"k">>, <<Id:32>>, 1, 100) || Id <- lists:seq(1, 513)],
    [G1, G2, L] = frames(Held),
    ?assertEqual({group, lists:seq(1, 256)}, {element(1, G1), ids(G1)}),
    ?assertEqual({group, lists:seq(257, 512)}, {element(1, G2), ids(G2)}),
    ?assertEqual({lone, [513]}, {element(1, L), ids(L)}),
    {group, <<"k">>, 1, _, Inputs} = decode(G2),
    ?assertEqual(<< <<Id:32>> || Id <- lists:seq(257, 512) >>, Inputs).

%% Split at 1 MiB of inputs: 64 KiB inputs go 16 a frame.
split_by_bytes_test() ->
    Held = [cand(Id, <<"k">>, binary:copy(<<Id>>, 65536), 1, 100) || Id <- lists:seq(1, 34)],
    Units = frames(Held),
    ?assertEqual([{group, 16}, {group, 16}, {group, 2}], [{element(1, U), length(ids(U))} || U <- Units]),
    [?assert(iolist_size(element(3, U)) < 2 * 1048576) || U <- Units].

%% A calls frame holds at most 64 calls.
calls_frames_split_test() ->
    Held = [held(Id, ping, {}, 100) || Id <- lists:seq(1, 130)],
    Units = frames(Held),
    ?assertEqual([{calls, 64}, {calls, 64}, {calls, 2}], [{element(1, U), length(ids(U))} || U <- Units]),
    ?assertEqual(lists:seq(1, 130), lists:append([ids(U) || U <- Units])).
-endif.
